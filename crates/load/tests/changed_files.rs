//! A checkpoint changed while qdrift reads it part by part: cut short (`cp new.gguf model.gguf`
//! over a model in use) or rewritten in place at the same size (`dd conv=notrunc`, `rsync
//! --inplace`, a resumed download) after it was opened as a source. Reading a part afterwards is
//! an error naming the file, never a `SIGBUS` (which killed the process when the parts were read
//! from a memory map) nor other numbers than those checked at open.
//!
//! Fixtures: the synthetic `tiny` model (2 layers, F32) written as a GGUF file and as a Hugging
//! Face folder by `qdrift_load::write`.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use qdrift_load::write::{WriteDtype, write_gguf, write_hf_folder};
use qdrift_load::{HostModel, LoadedModel, WeightSource, byte_tokenizer, open_source, synthetic_model};

fn tiny() -> HostModel {
    synthetic_model("tiny", 3).expect("tiny").model
}

fn not_called(_: &mut HostModel) {
    panic!("a GGUF file's or a folder's parts are not prepared whole");
}

/// `tiny` as `m.gguf` in `dir`: the model path and the file that holds the weights.
fn gguf(dir: &Path) -> (PathBuf, PathBuf) {
    let path = dir.join("m.gguf");
    write_gguf(&path, &tiny(), &byte_tokenizer(320).expect("tok"), WriteDtype::F32).expect("written");
    (path.clone(), path)
}

/// `tiny` as a Hugging Face folder `dir`: the model path and the file that holds the weights.
fn folder(dir: &Path) -> (PathBuf, PathBuf) {
    write_hf_folder(dir, &tiny(), &byte_tokenizer(320).expect("tok"), WriteDtype::F32).expect("written");
    (dir.to_path_buf(), dir.join("model.safetensors"))
}

fn open(model: &Path) -> LoadedModel<Arc<dyn WeightSource>> {
    open_source(model, None, &not_called).unwrap_or_else(|e| panic!("{}: {e}", model.display()))
}

/// Asserts that `e` is one line naming `weights` as changed.
fn assert_changed(e: &str, weights: &Path) {
    let named = format!("{}: the model changed while qdrift was reading it (", weights.display());
    assert!(e.starts_with(&named) && !e.contains('\n'), "{e}");
    assert!(e.ends_with("; rerun once the file is complete"), "{e}");
}

/// The weights file cut to half its length after the source was opened: the last block, past
/// the cut, is an error naming the file and the sizes.
fn cut_short(make: fn(&Path) -> (PathBuf, PathBuf)) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (model, weights) = make(dir.path());
    let source = open(&model);
    let len = std::fs::metadata(&weights).expect("weights").len();
    std::fs::OpenOptions::new().write(true).open(&weights).expect("opens").set_len(len / 2).expect("truncates");
    let last = source.model.arch().n_layers - 1;
    let e = source.model.layer(last).expect_err("refused").to_string();
    assert_changed(&e, &weights);
    assert!(e.contains(&format!("size {len} → {} bytes", len / 2)), "{e}");
}

/// The last byte of the weights file (the low byte of the last tensor's last value, so still a
/// finite number) changed in place, at the same length, after the source was opened: reading the
/// model's parts again is an error naming the file.
fn rewritten_in_place(make: fn(&Path) -> (PathBuf, PathBuf)) {
    let dir = tempfile::tempdir().expect("tempdir");
    let (model, weights) = make(dir.path());
    let source = open(&model);
    let last = std::fs::read(&weights).expect("weights").last().copied().expect("not empty");
    let mut file = std::fs::OpenOptions::new().write(true).open(&weights).expect("opens");
    file.seek(SeekFrom::End(-1)).expect("seeks");
    file.write_all(&[last ^ 1]).expect("writes");
    drop(file);
    let e = HostModel::from_source(&*source.model).expect_err("refused").to_string();
    assert_changed(&e, &weights);
}

#[test]
fn a_gguf_file_cut_short_after_open_is_an_error_not_a_signal() {
    cut_short(gguf);
}

#[test]
fn a_safetensors_file_cut_short_after_open_is_an_error_not_a_signal() {
    cut_short(folder);
}

#[test]
fn a_gguf_file_rewritten_in_place_after_open_is_an_error() {
    rewritten_in_place(gguf);
}

#[test]
fn a_safetensors_file_rewritten_in_place_after_open_is_an_error() {
    rewritten_in_place(folder);
}

/// A file changed and then changed back to its bytes and length is still refused: its times
/// say it was written (the stamp is taken when the file is opened, not from its bytes).
#[test]
fn a_file_written_back_to_its_old_bytes_is_still_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (model, weights) = gguf(dir.path());
    let source = open(&model);
    let bytes = std::fs::read(&weights).expect("weights");
    // Past a coarse file-system clock's tick (Linux before 6.13: a jiffy), so that the write's
    // time differs from the time the file was written with.
    std::thread::sleep(std::time::Duration::from_millis(50));
    std::fs::OpenOptions::new().write(true).open(&weights).expect("opens").write_all(&bytes).expect("writes");
    let e = source.model.layer(0).expect_err("refused").to_string();
    assert_changed(&e, &weights);
}
