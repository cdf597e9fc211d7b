//! The fuzzer's crash corpus as regression tests: every input saved under `tests/fuzz/crashes/`
//! replays through its reader, which must refuse it (or accept it) without panicking. Also
//! checks the harness itself: every seed is accepted, mutation is reproducible, and a saved crash
//! replays from a crash folder.

use std::path::Path;

use qdrift_tests::fuzz::{Outcome, Rng, Target, Workspace, crashes, target, targets};

fn workspace(target: &dyn Target, tmp: &Path) -> Workspace {
    Workspace::new(target, &tmp.join(target.name())).unwrap_or_else(|e| panic!("{}: {e}", target.name()))
}

/// Replays every saved input of `dir`; returns how many replayed.
fn replay_all(dir: &Path) -> usize {
    let tmp = tempfile::tempdir().expect("temp dir");
    let mut replayed = 0;
    for target in targets() {
        let inputs = crashes::inputs(dir, target.name());
        if inputs.is_empty() {
            continue;
        }
        let ws = workspace(*target, tmp.path());
        for input in inputs {
            let bytes = std::fs::read(&input).expect("reads the saved input");
            match ws.exec(*target, &bytes) {
                Ok(_) => replayed += 1,
                Err(panic) => panic!("{} ({}) still crashes: {panic}", input.display(), target.name()),
            }
        }
    }
    replayed
}

#[test]
fn every_saved_crash_input_replays_without_panicking() {
    let replayed = replay_all(&crashes::default_dir());
    println!("replayed {replayed} saved crash inputs");
}

#[test]
fn every_target_accepts_its_own_seeds() {
    let tmp = tempfile::tempdir().expect("temp dir");
    for target in targets() {
        let ws = workspace(*target, tmp.path());
        assert!(!ws.seeds.is_empty(), "{} has no seeds", target.name());
        for (i, seed) in ws.seeds.iter().enumerate() {
            let outcome = ws.exec(*target, seed).unwrap_or_else(|p| panic!("{} seed {i} panics: {p}", target.name()));
            assert_eq!(outcome, Outcome::Accepted, "{} seed {i} must be valid", target.name());
        }
    }
}

#[test]
fn mutation_is_reproducible_from_the_seed_and_changes_the_input() {
    let tmp = tempfile::tempdir().expect("temp dir");
    for target in targets() {
        let ws = workspace(*target, tmp.path());
        let run = |seed: u64| -> Vec<Vec<u8>> {
            let mut rng = Rng::new(seed);
            (0..20).map(|_| target.mutate(&mut rng, &ws.seeds[0], &ws.seeds)).collect()
        };
        let first = run(5);
        assert_eq!(first, run(5), "{}: same seed, same mutations", target.name());
        assert!(first.iter().any(|m| *m != ws.seeds[0]), "{}: 20 mutations left the seed as it was", target.name());
    }
}

#[test]
fn a_saved_truncated_gguf_replays_and_is_refused() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let gguf = target("gguf").expect("the gguf target");
    let ws = workspace(gguf, tmp.path());
    let truncated = &ws.seeds[0][..ws.seeds[0].len() / 3];
    let crash_dir = tmp.path().join("crashes");
    let saved = crashes::save(&crash_dir, "gguf", truncated, "synthetic", "a truncated GGUF").expect("saves");
    assert_eq!(crashes::inputs(&crash_dir, "gguf"), vec![saved.clone()]);
    assert_eq!(crashes::signatures(&crash_dir, "gguf").into_iter().collect::<Vec<_>>(), vec!["synthetic"]);
    assert_eq!(replay_all(&crash_dir), 1);
    let outcome = ws.exec(gguf, &std::fs::read(&saved).expect("reads")).expect("no panic");
    assert!(
        matches!(outcome, Outcome::Refused(ref m) if !m.is_empty()),
        "a truncated GGUF must be refused: {outcome:?}"
    );
}

#[test]
fn a_panicking_reader_is_caught_as_a_crash_not_a_test_failure() {
    struct Panics;
    impl Target for Panics {
        fn name(&self) -> &'static str {
            "panics"
        }
        fn input_name(&self) -> &'static str {
            "input"
        }
        fn prepare(&self, _work: &Path) -> Result<Vec<Vec<u8>>, String> {
            Ok(vec![vec![1]])
        }
        fn mutate(&self, _rng: &mut Rng, seed: &[u8], _donors: &[Vec<u8>]) -> Vec<u8> {
            seed.to_vec()
        }
        fn run(&self, input: &Path) -> Outcome {
            let bytes = std::fs::read(input).expect("reads");
            panic!("index {} out of range", bytes[0]);
        }
    }
    let tmp = tempfile::tempdir().expect("temp dir");
    let ws = workspace(&Panics, tmp.path());
    let message = ws.exec(&Panics, &[1]).expect_err("the panic is caught");
    assert!(message.contains("index 1 out of range"), "{message}");
}

#[test]
fn the_fuzz_binary_runs_a_target_under_its_supervisor_and_reports_executions() {
    let tmp = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qdrift-fuzz"))
        .args(["--seconds", "1", "--target", "thresholds", "--seed", "3", "--crashes"])
        .arg(tmp.path())
        .output()
        .expect("runs qdrift-fuzz");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let line = stdout.lines().find(|l| l.starts_with("fuzz thresholds")).unwrap_or_else(|| panic!("{stdout}"));
    let execs: u64 = line.split_whitespace().nth(2).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(execs > 10, "a second of fuzzing ran {execs} executions: {line}");
    assert!(line.contains(" 0 crashes"), "{line}");
}
