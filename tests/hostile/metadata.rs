//! Files qdrift wrote itself, edited: a shard's part (`part.json`, `traces.bin`) and a saved
//! reference (`manifest.json`, `reference.bin`). Every field of the JSON is under the seal at the
//! end of the data file, so an edit of either file alone is refused; an edit with the seal
//! recomputed (as a careful forger, or the fuzzer, would) still meets the range checks: shard and
//! counts against the workload, prompt indices against the shard rule, section names and values
//! against what a run writes. Also: `--shard` counts that cannot give every shard a batch,
//! special files as members, an old layout, errors that name the flag and path the user gave,
//! and `--phase-times` with `--shard`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::{USER, fifo, names, qdrift_command, refused, stories};

/// The workload of every run here: 5 prompts in batches of 2 (3 batches), horizons 5 and 20.
const COMMON: [&str; 12] = [
    "--prompts",
    "5",
    "--horizons",
    "5,20",
    "--batch-size",
    "2",
    "--schemes",
    "int8",
    "--resamples",
    "100",
    "--backend",
    "cpu",
];

/// `qdrift eval` on stories260K with [`COMMON`] and `extra`, writing to `out`.
fn eval(out: &Path, extra: &[&str]) -> Command {
    let dir = stories();
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(dir.join("stories260K.bin")).arg("--tokenizer").arg(dir.join("tok512.bin"));
    c.args(COMMON).args(extra).arg("--out").arg(out);
    c
}

fn succeeds(mut c: Command) -> String {
    let o = c.output().expect("qdrift runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The three parts of the run (`root/p0` … `root/p2`).
fn parts(root: &Path) -> Vec<PathBuf> {
    (0..3)
        .map(|i| {
            let part = root.join(format!("p{i}"));
            succeeds(eval(&part, &["--shard", &format!("{i}/3")]));
            part
        })
        .collect()
}

/// A store saved by the run (`root/store`).
fn store(root: &Path) -> PathBuf {
    let dir = root.join("store");
    succeeds(eval(&root.join("whole"), &["--save-reference", dir.to_str().unwrap()]));
    dir
}

/// `qdrift merge PARTS --out root/merged`.
fn merge(root: &Path, parts: &[PathBuf]) -> Command {
    let mut c = qdrift_command();
    c.arg("merge").args(parts).arg("--out").arg(root.join("merged"));
    c
}

/// A copy of the container folder `from` at `to`.
fn copy(from: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
    to.to_path_buf()
}

/// Edits the JSON (`edit_json`) and the data before its seal (`edit_data`, with the JSON) of
/// the container at `dir`, then recomputes the seal as qdrift would ([`qdrift_eval::seal`]).
fn forge(
    dir: &Path,
    (json_name, data_name, format): (&str, &str, &str),
    edit_json: impl FnOnce(&mut Value),
    edit_data: impl FnOnce(&Value, &mut Vec<u8>),
) {
    let mut json: Value = serde_json::from_slice(&std::fs::read(dir.join(json_name)).unwrap()).unwrap();
    edit_json(&mut json);
    let file = std::fs::read(dir.join(data_name)).unwrap();
    let mut data = file[..file.len() - 32].to_vec();
    edit_data(&json, &mut data);
    let text = serde_json::to_vec_pretty(&json).unwrap();
    let digest = qdrift_eval::seal(format, &text, &data);
    data.extend_from_slice(&digest);
    std::fs::write(dir.join(json_name), text).unwrap();
    std::fs::write(dir.join(data_name), data).unwrap();
}

const PART: (&str, &str, &str) = ("part.json", "traces.bin", qdrift_eval::PART_FORMAT);
const STORE: (&str, &str, &str) = ("manifest.json", "reference.bin", qdrift_eval::STORE_FORMAT);

/// The byte offset of section `name` in a container's JSON.
fn offset(json: &Value, name: &str) -> usize {
    let sections = json["sections"].as_array().unwrap();
    let s = sections.iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no section {name}"));
    s["offset"].as_u64().unwrap() as usize
}

#[test]
fn an_edited_part_json_or_manifest_is_refused_by_the_seal_even_with_consistent_data() {
    let root = tempfile::tempdir().unwrap();
    let p = parts(root.path());
    succeeds(merge(root.path(), &p));
    // Shard 0 claims to be shard 1: part.json alone edited.
    let edited = copy(&p[0], &root.path().join("edited"));
    let text = std::fs::read_to_string(edited.join("part.json")).unwrap();
    std::fs::write(edited.join("part.json"), text.replacen("\"index\": 0", "\"index\": 1", 1)).unwrap();
    refused(USER, merge(root.path(), &[edited, p[1].clone(), p[2].clone()]), &["part", "edited", "checksum"]);
    // A noise-floor KL divergence of the store set to 0.5 without resealing.
    let s = store(root.path());
    let json: Value = serde_json::from_slice(&std::fs::read(s.join("manifest.json")).unwrap()).unwrap();
    let mut data = std::fs::read(s.join("reference.bin")).unwrap();
    let at = offset(&json, "noise_floor/kld");
    data[at..at + 4].copy_from_slice(&0.5f32.to_le_bytes());
    std::fs::write(s.join("reference.bin"), data).unwrap();
    let out = root.path().join("reused");
    refused(USER, eval(&out, &["--reference", s.to_str().unwrap()]), &["--reference", "store", "checksum"]);
    assert!(!out.exists());
}

#[test]
fn a_resealed_part_with_an_impossible_shard_or_count_is_refused_naming_the_field() {
    let root = tempfile::tempdir().unwrap();
    let p = parts(root.path());
    type Edit = fn(&mut Value);
    let cases: [(&str, Edit, &[&str]); 6] = [
        ("index", |j| j["shard"]["index"] = 5.into(), &["part.json", "shard 5/3"]),
        ("count-zero", |j| j["shard"]["count"] = 0.into(), &["part.json", "shard 0/0"]),
        ("count-huge", |j| j["shard"]["count"] = 1_000_000_000_000_000u64.into(), &["part.json", "3 batches"]),
        (
            "prompts-huge",
            |j| j["context"]["workload"]["prompts"] = 1_000_000_000_000_000u64.into(),
            &["part.json", "workload.prompts", "1000000000000000"],
        ),
        (
            "resamples-huge",
            |j| j["context"]["workload"]["bootstrap_resamples"] = 1_000_000_000_000_000u64.into(),
            &["part.json", "workload.bootstrap_resamples", "--resamples"],
        ),
        (
            "reordered",
            |j| {
                let mut indices = j["prompt_indices"].as_array().unwrap().clone();
                indices.reverse();
                j["prompt_indices"] = indices.into();
            },
            &["part.json", "prompt_indices[0]", "shard 0/3"],
        ),
    ];
    for (name, edit, needles) in cases {
        let forged = copy(&p[0], &root.path().join(name));
        forge(&forged, PART, edit, |_, _| {});
        let mut needles = needles.to_vec();
        needles.push(name);
        refused(USER, merge(root.path(), &[forged, p[1].clone(), p[2].clone()]), &needles);
        assert!(!root.path().join("merged").exists());
    }
}

#[test]
fn a_resealed_store_with_an_overflowing_section_or_a_nan_kl_is_refused_naming_file_and_field() {
    let root = tempfile::tempdir().unwrap();
    let s = store(root.path());
    let run = |dir: &Path, needles: &[&str]| {
        let out = root.path().join("reused");
        let mut n = vec!["--reference", dir.to_str().unwrap()];
        n.extend_from_slice(needles);
        refused(USER, eval(&out, &["--reference", dir.to_str().unwrap()]), &n);
        assert!(!out.exists());
    };
    let overflow = copy(&s, &root.path().join("overflow"));
    let rename = |j: &mut Value| {
        let sections = j["sections"].as_array_mut().unwrap();
        let hidden = sections.iter_mut().find(|s| s["name"] == "hidden/2/1").unwrap();
        hidden["name"] = "hidden/18446744073709551615/1".into();
    };
    forge(&overflow, STORE, rename, |_, _| {});
    run(&overflow, &["reference.bin", "hidden/2/1", "missing"]);
    for (name, value, needle) in [("nan", f32::NAN, "is NaN"), ("negative", -0.5, "is -0.5")] {
        let forged = copy(&s, &root.path().join(name));
        forge(
            &forged,
            STORE,
            |_| {},
            |j, data| {
                let at = offset(j, "noise_floor/kld") + 4 * 7;
                data[at..at + 4].copy_from_slice(&value.to_le_bytes());
            },
        );
        run(&forged, &["reference.bin", "noise_floor/kld", "prompt 1 position 7", needle]);
    }
    // A token past the vocabulary of 512 in the stored continuations.
    let token = copy(&s, &root.path().join("token"));
    forge(
        &token,
        STORE,
        |_| {},
        |j, data| {
            let at = offset(j, "tokens") + 4 * 21;
            data[at..at + 4].copy_from_slice(&600u32.to_le_bytes());
        },
    );
    run(&token, &["reference.bin", "section tokens", "prompt 2 position 1", "600", "vocabulary of 512"]);
}

#[test]
fn shard_counts_that_leave_a_shard_without_a_batch_are_refused_before_running() {
    let root = tempfile::tempdir().unwrap();
    let out = root.path().join("part");
    // 5 prompts in batches of 2 make 3 batches.
    for shard in ["0/5", "1/99999999999", "0/18446744073709551615"] {
        let (line, took) = refused(USER, eval(&out, &["--shard", shard]), &["--shard", shard, "at most 3 shards"]);
        assert!(!out.exists(), "{shard}: {line}");
        assert!(took.as_secs() < 5, "{shard}: refused before loading, took {took:?}");
    }
    // An index not below the count is a usage error (clap's exit code 2).
    let usage = crate::Refusal { code: 2, prefix: "error: " };
    for shard in ["0/0", "3/3", "18446744073709551615/18446744073709551615"] {
        refused(usage, eval(&out, &["--shard", shard]), &["--shard", "0 ≤ INDEX < COUNT"]);
    }
    // Without --batch-size, --prompts alone bounds the batches.
    let mut c = qdrift_command();
    c.args(["eval", "--model"]).arg(stories().join("stories260K.bin"));
    c.args(["--prompts", "2", "--shard", "0/3", "--out"]).arg(&out);
    refused(USER, c, &["--shard 0/3", "2 prompts", "at most 2 shards"]);
    assert_eq!(names(root.path()), Vec::<String>::new(), "no part, no staging, no lock");
}

#[cfg(unix)]
#[test]
fn special_files_as_store_or_part_members_are_refused_without_opening_them() {
    let root = tempfile::tempdir().unwrap();
    let p = parts(root.path());
    let s = store(root.path());
    for (member, what) in [("part.json", "the part header"), ("traces.bin", "the part data")] {
        let dir = copy(&p[0], &root.path().join(format!("fifo-{member}")));
        std::fs::remove_file(dir.join(member)).unwrap();
        fifo(&dir, member);
        refused(USER, merge(root.path(), &[dir, p[1].clone(), p[2].clone()]), &[member, what, "named pipe"]);
        let dir = copy(&p[0], &root.path().join(format!("dir-{member}")));
        std::fs::remove_file(dir.join(member)).unwrap();
        std::fs::create_dir(dir.join(member)).unwrap();
        refused(USER, merge(root.path(), &[dir, p[1].clone(), p[2].clone()]), &[member, what, "folder"]);
    }
    for (member, what) in [("manifest.json", "the store manifest"), ("reference.bin", "the store data")] {
        let dir = copy(&s, &root.path().join(format!("fifo-{member}")));
        std::fs::remove_file(dir.join(member)).unwrap();
        fifo(&dir, member);
        let out = root.path().join("reused");
        let needles = ["--reference", member, what, "named pipe"];
        refused(USER, eval(&out, &["--reference", dir.to_str().unwrap()]), &needles);
        let dir = copy(&s, &root.path().join(format!("zero-{member}")));
        std::fs::remove_file(dir.join(member)).unwrap();
        std::os::unix::fs::symlink("/dev/zero", dir.join(member)).unwrap();
        let needles = ["--reference", member, what, "character device"];
        refused(USER, eval(&out, &["--reference", dir.to_str().unwrap()]), &needles);
    }
}

#[test]
fn a_part_or_store_of_the_previous_layout_is_refused_saying_what_to_do() {
    let root = tempfile::tempdir().unwrap();
    let p = parts(root.path());
    let old = copy(&p[0], &root.path().join("old"));
    let text = std::fs::read_to_string(old.join("part.json")).unwrap();
    std::fs::write(old.join("part.json"), text.replacen("\"version\": 3", "\"version\": 2", 1)).unwrap();
    let needles = ["part.json", "qdrift-part version 2", "run its shard again"];
    refused(USER, merge(root.path(), &[old, p[1].clone(), p[2].clone()]), &needles);
    let s = store(root.path());
    let text = std::fs::read_to_string(s.join("manifest.json")).unwrap();
    std::fs::write(s.join("manifest.json"), text.replacen("\"version\": 3", "\"version\": 2", 1)).unwrap();
    let needles = ["--reference", "manifest.json", "qdrift-reference version 2", "--save-reference"];
    refused(USER, eval(&root.path().join("reused"), &["--reference", s.to_str().unwrap()]), &needles);
}

#[test]
fn store_errors_name_the_flag_and_path_given_never_a_staging_folder() {
    let root = tempfile::tempdir().unwrap();
    // A store under a file: its folder cannot be made.
    let file = root.path().join("file");
    std::fs::write(&file, "").unwrap();
    let target = file.join("store");
    let c = eval(&root.path().join("whole"), &["--save-reference", target.to_str().unwrap()]);
    let (line, _) = refused(USER, c, &["--save-reference", target.to_str().unwrap()]);
    assert!(!line.contains(".qdrift"), "names a staging path: {line}");
    // A missing store.
    let absent = root.path().join("absent");
    let c = eval(&root.path().join("reused"), &["--reference", absent.to_str().unwrap()]);
    refused(USER, c, &["--reference", absent.to_str().unwrap(), "manifest.json"]);
}

#[test]
fn phase_times_are_printed_for_a_shard_too() {
    let root = tempfile::tempdir().unwrap();
    let stderr = succeeds(eval(&root.path().join("part"), &["--shard", "0/3", "--phase-times"]));
    for phase in ["phase times:", "prefill", "decode", "teacher forcing", "write the part", "total"] {
        assert!(stderr.contains(phase), "{phase:?} missing from: {stderr}");
    }
}
