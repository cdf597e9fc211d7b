"""The shell steps of a CI example under examples/ci/, for `cargo xtask ci` to run.

Prints NUL-terminated records: `env KEY=VALUE` for each of the job's variables, then `run COMMAND`
for each `run:` step of a GitHub Actions job, or each `script:` then `after_script:` line of a
GitLab CI job, in order (NUL: a command may hold newlines, never a NUL). Steps that
`uses:` an action are left out: they are the CI service's, not qdrift's.
"""
import sys

import yaml


def github(doc):
    (job,) = doc["jobs"].values()
    commands = [step["run"] for step in job["steps"] if "run" in step]
    return job.get("env", {}), commands


def gitlab(doc):
    jobs = [v for k, v in doc.items() if isinstance(v, dict) and "script" in v]
    (job,) = jobs
    return job.get("variables", {}), list(job["script"]) + list(job.get("after_script", []))


def main(path):
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    env, commands = github(doc) if "jobs" in doc else gitlab(doc)
    for c in commands:
        if "${{" in c:
            sys.exit(f"{path}: a shell step uses a GitHub expression; use an env variable: {c}")
    for k, v in env.items():
        sys.stdout.write(f"env {k}={v}\0")
    for c in commands:
        sys.stdout.write(f"run {c}\0")


if __name__ == "__main__":
    main(sys.argv[1])
