//! `cargo xtask cycles`: the import graph between the modules (files) of each crate, any cycle in
//! it, and any import up a declared floor. CI runs it with the lints: no crate may have a module
//! cycle (ARCHITECTURE.md's invariant "data flows one way" holds inside crates too).
//!
//! Floors: a module whose `//!` doc has a table whose header's first cell is `floor` declares
//! the order of its child modules, top floor first; each row's first cell names one floor's
//! modules in backticks (`run/`, `types.rs`, or a doc link to the module). Every child must be on
//! exactly one floor, every name must be a child, and a module may import only modules on floors
//! below its own: an edge between two modules is checked in the table of their closest common
//! ancestor (`check::memory` → `types` in the root's, `run::scoring` → `run::texts` in `run`'s).
//! An edge between a module and its own ancestor is left to the cycle check. A crate declares
//! floors where its graph has a one-way order; those without a table are checked for cycles only.
//!
//! Written here rather than taken from a crate: `cargo-modules` builds rust-analyzer (tens of
//! minutes on two cores) and reports items, not the file-level "who imports whom" that a reader
//! of the tree follows. This is a text scan, exact for the forms the workspace uses:
//! - a node is a module with its own file (`lib.rs`/`main.rs` the root, `a.rs` or `a/mod.rs`,
//!   `a/b.rs`); inline modules belong to their file, and `#[cfg(test)] mod … { … }` blocks,
//!   comments and string literals are left out;
//! - an edge A → B is a path in A's code that names an item of B: `crate::…`, `super::…`,
//!   `self::…`, or a path starting with one of A's child modules, in `use` trees (braces
//!   expanded) and in expressions. A path to an item that a module re-exports from a descendant
//!   (`pub use child::Item`, or a glob) resolves to the descendant that defines it;
//! - `mod` declarations and a module's `pub use` of its own descendants (a facade) are not edges:
//!   a parent that only declares and re-exports its children does not depend on them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One module: its path from the crate root, its code (comments, strings and test blocks
/// removed), and the names of the items it defines.
struct Module {
    file: PathBuf,
    code: String,
    items: BTreeSet<String>,
    /// Its child modules' floors, top first, when its doc declares them ([`floor_table`]).
    floors: Option<Vec<Vec<String>>>,
}

/// The import graph of one crate.
pub struct Graph {
    /// The crate's name (its folder).
    pub name: String,
    modules: BTreeMap<Vec<String>, Module>,
    /// Edges between modules, each with one line of the importing file as evidence.
    edges: BTreeMap<(Vec<String>, Vec<String>), String>,
}

/// Every crate of the workspace: `crates/*`, `tests`, `xtask`.
pub fn check(root: &Path) -> Result<(), String> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .map_err(|e| format!("crates/: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    dirs.sort();
    dirs.push(root.join("tests"));
    dirs.push(root.join("xtask"));
    let mut failures = Vec::new();
    for dir in dirs {
        let src = dir.join("src");
        let Some(root_file) = ["lib.rs", "main.rs"].iter().map(|f| src.join(f)).find(|p| p.is_file()) else {
            continue;
        };
        let graph = Graph::read(&dir.file_name().unwrap_or_default().to_string_lossy(), &root_file)?;
        let cycles = graph.cycles();
        let upward = graph.upward();
        let declared = graph.modules.values().filter(|m| m.floors.is_some()).count();
        println!(
            "xtask: cycles: {:<10} {:>3} modules, {:>3} edges, {} cycles, {}",
            graph.name,
            graph.modules.len(),
            graph.edges.len(),
            cycles.len(),
            if declared == 0 {
                "no floors declared".to_string()
            } else {
                format!("floors in {declared} modules, {} upward imports", upward.len())
            }
        );
        if declared == 0 && cycles.is_empty() && std::env::var_os("QDRIFT_SUGGEST_FLOORS").is_some() {
            println!("{}", graph.suggest_root_floors().join("\n"));
        }
        failures.extend(upward.into_iter().map(|u| format!("{}: {u}", graph.name)));
        for cycle in cycles {
            let names: Vec<String> = cycle.iter().map(|m| display(m)).collect();
            let mut lines = vec![format!("{}: module cycle {}", graph.name, names.join(" ↔ "))];
            for ((from, to), evidence) in &graph.edges {
                if cycle.contains(from) && cycle.contains(to) {
                    lines.push(format!("    {} → {}: {evidence}", display(from), display(to)));
                }
            }
            failures.push(lines.join("\n"));
        }
    }
    if failures.is_empty() {
        println!("xtask: cycles: none, and no upward import");
        Ok(())
    } else {
        Err(format!("module import cycles or upward imports:\n{}", failures.join("\n")))
    }
}

/// `a::b`, or `(root)`.
fn display(module: &[String]) -> String {
    if module.is_empty() { "(root)".to_string() } else { module.join("::") }
}

impl Graph {
    /// Reads the crate whose root file is `root_file`, following `mod` declarations.
    pub fn read(name: &str, root_file: &Path) -> Result<Graph, String> {
        let mut modules = BTreeMap::new();
        let mut pending = vec![(Vec::new(), root_file.to_path_buf())];
        while let Some((path, file)) = pending.pop() {
            let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
            let code = strip_test_blocks(&strip_comments_and_strings(&text));
            // Children live beside a root or `mod.rs` file, else in a folder named after the file.
            let base = match file.file_name().and_then(|n| n.to_str()) {
                Some("lib.rs" | "main.rs" | "mod.rs") => file.parent().map(Path::to_path_buf).unwrap_or_default(),
                _ => file.with_extension(""),
            };
            for child in mod_declarations(&code) {
                let mut child_path = path.clone();
                child_path.push(child.clone());
                let flat = base.join(format!("{child}.rs"));
                let nested = base.join(&child).join("mod.rs");
                if flat.is_file() {
                    pending.push((child_path, flat));
                } else if nested.is_file() {
                    pending.push((child_path, nested));
                }
            }
            let items = defined_items(&code);
            let floors = floor_table(&text);
            modules.insert(path, Module { file, code, items, floors });
        }
        let mut graph = Graph { name: name.to_string(), modules, edges: BTreeMap::new() };
        graph.edges = graph.find_edges();
        Ok(graph)
    }

    /// Every edge, from every path in every module's code.
    fn find_edges(&self) -> BTreeMap<(Vec<String>, Vec<String>), String> {
        let reexports = self.reexports();
        let mut edges = BTreeMap::new();
        for (from, module) in &self.modules {
            for statement in statements(&module.code) {
                let facade = is_pub_use(&statement.text);
                for path in paths_in(&statement.text) {
                    let Some(absolute) = self.absolute(from, &path) else { continue };
                    let Some(to) = self.resolve(&absolute, &reexports) else { continue };
                    if &to == from || (facade && to.starts_with(from)) {
                        continue;
                    }
                    let evidence = format!("{}:{}: {}", short(&module.file), statement.line, path.join("::"));
                    edges.entry((from.clone(), to)).or_insert(evidence);
                }
            }
        }
        edges
    }

    /// `pub use` re-exports of descendants: (module, name) → the absolute path re-exported, and
    /// each module's glob re-exports.
    fn reexports(&self) -> Reexports {
        let mut named = BTreeMap::new();
        let mut globs: BTreeMap<Vec<String>, Vec<Vec<String>>> = BTreeMap::new();
        for (from, module) in &self.modules {
            for statement in statements(&module.code).into_iter().filter(|s| is_pub_use(&s.text)) {
                for (path, alias) in use_tree_paths(&statement.text) {
                    let Some(absolute) = self.absolute(from, &path) else { continue };
                    if !absolute.starts_with(from) || absolute.len() <= from.len() {
                        continue;
                    }
                    if absolute.last().is_some_and(|s| s == "*") {
                        globs.entry(from.clone()).or_default().push(absolute[..absolute.len() - 1].to_vec());
                    } else if let Some(name) = alias.or_else(|| absolute.last().cloned()) {
                        named.insert((from.clone(), name), absolute);
                    }
                }
            }
        }
        Reexports { named, globs }
    }

    /// A path as written in module `from`, made absolute from the crate root; `None` for paths
    /// into other crates or the standard library.
    fn absolute(&self, from: &[String], path: &[String]) -> Option<Vec<String>> {
        let first = path.first()?;
        let mut out: Vec<String> = match first.as_str() {
            "crate" | "$crate" => Vec::new(),
            "self" => from.to_vec(),
            "super" => from[..from.len().checked_sub(1)?].to_vec(),
            _ => {
                let mut child = from.to_vec();
                child.push(first.clone());
                if !self.modules.contains_key(&child) {
                    return None;
                }
                child
            }
        };
        let mut rest = &path[1..];
        while rest.first().is_some_and(|s| s == "super") {
            out.pop();
            rest = &rest[1..];
        }
        out.extend(rest.iter().cloned());
        Some(out)
    }

    /// The module that defines what an absolute path names.
    fn resolve(&self, absolute: &[String], reexports: &Reexports) -> Option<Vec<String>> {
        // The longest prefix that is a module.
        let mut module = Vec::new();
        let mut at = 0;
        while at < absolute.len() {
            let mut next = module.clone();
            next.push(absolute[at].clone());
            if !self.modules.contains_key(&next) {
                break;
            }
            module = next;
            at += 1;
        }
        let Some(item) = absolute.get(at) else { return Some(module) };
        if item == "*" || item == "self" {
            return Some(module);
        }
        self.resolve_item(&module, item, reexports, 0)
    }

    /// The module that defines `item` as seen from `module` (through re-exports).
    fn resolve_item(&self, module: &[String], item: &str, reexports: &Reexports, depth: usize) -> Option<Vec<String>> {
        let here = self.modules.get(module)?;
        if here.items.contains(item) || depth > 8 {
            return Some(module.to_vec());
        }
        if let Some(target) = reexports.named.get(&(module.to_vec(), item.to_string())) {
            return self.resolve(target, reexports).or_else(|| Some(module.to_vec()));
        }
        for glob in reexports.globs.get(module).into_iter().flatten() {
            let defines = self.modules.get(glob).is_some_and(|m| m.items.contains(item));
            if defines || reexports.named.contains_key(&(glob.clone(), item.to_string())) {
                return self.resolve_item(glob, item, reexports, depth + 1);
            }
        }
        Some(module.to_vec())
    }

    /// Every breach of a declared floor order: a child on no floor or a name on a floor that is
    /// no child, and each import of a module on the same or a higher floor, naming the file, the
    /// line and the path imported.
    pub fn upward(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (parent, module) in &self.modules {
            let Some(floors) = &module.floors else { continue };
            let children: BTreeSet<&String> = self
                .modules
                .keys()
                .filter(|k| k.len() == parent.len() + 1 && k.starts_with(parent))
                .filter_map(|k| k.last())
                .collect();
            let declared: Vec<&String> = floors.iter().flatten().collect();
            for child in &children {
                match declared.iter().filter(|d| *d == child).count() {
                    0 => out.push(format!("{}: module {child} is on no floor of its table", short(&module.file))),
                    1 => {}
                    _ => out.push(format!("{}: module {child} is on two floors of its table", short(&module.file))),
                }
            }
            for name in declared.iter().filter(|d| !children.contains(*d)) {
                out.push(format!("{}: the floor table names {name}, which is no module here", short(&module.file)));
            }
        }
        for ((from, to), evidence) in &self.edges {
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                continue;
            }
            let Some(floors) = self.modules.get(&from[..common]).and_then(|m| m.floors.as_ref()) else { continue };
            let floor = |name: &String| floors.iter().position(|f| f.contains(name));
            if let (Some(a), Some(b)) = (floor(&from[common]), floor(&to[common]))
                && a >= b
            {
                let table = self.modules.get(&from[..common]).map(|m| short(&m.file)).unwrap_or_default();
                let which = if a == b { "the same floor" } else { "a higher floor" };
                out.push(format!(
                    "{evidence}: {} imports {}, on {which} of {table}'s table",
                    display(from),
                    display(to)
                ));
            }
        }
        out
    }

    /// A floor table for the crate root's children that its imports satisfy (with
    /// `QDRIFT_SUGGEST_FLOORS` set, for a crate that declares none): each child's floor is the
    /// longest import chain below it, top floor first.
    pub fn suggest_root_floors(&self) -> Vec<String> {
        let children: Vec<&String> = self.modules.keys().filter(|k| k.len() == 1).map(|k| &k[0]).collect();
        let below: BTreeMap<&String, BTreeSet<&String>> = children
            .iter()
            .map(|c| {
                let to = self.edges.keys().filter(|(f, t)| f.first() == Some(*c) && t.first().is_some_and(|t| t != *c));
                (*c, to.filter_map(|(_, t)| t.first()).collect())
            })
            .collect();
        let mut level: BTreeMap<&String, usize> = BTreeMap::new();
        // No cycles here (checked first), so this settles within `children.len()` rounds.
        for _ in 0..=children.len() {
            for c in &children {
                let l = below[c].iter().map(|t| level.get(t).map_or(1, |l| l + 1)).max().unwrap_or(0);
                level.insert(c, l);
            }
        }
        // Children that import each other through their submodules have no order (load's `hf` and
        // `gguf`): say so instead of suggesting a table that fails.
        for c in &children {
            if let Some(t) = below[c].iter().find(|t| level[*t] >= level[c]) {
                return vec![format!("{}: no floor table fits: {c} and {t} import each other", self.name)];
            }
        }
        let top = level.values().copied().max().unwrap_or(0);
        let mut rows = vec![format!("{}: //! | floor |", self.name), "//! |---|".to_string()];
        for l in (0..=top).rev() {
            let names: Vec<String> = children
                .iter()
                .filter(|c| level[*c] == l)
                .map(|c| {
                    let dir = self.modules.keys().any(|k| k.len() == 2 && &k[0] == *c);
                    if dir { format!("`{c}/`") } else { format!("`{c}.rs`") }
                })
                .collect();
            if !names.is_empty() {
                rows.push(format!("//! | {} |", names.join(", ")));
            }
        }
        rows
    }

    /// The strongly connected components of more than one module (Tarjan's algorithm).
    pub fn cycles(&self) -> Vec<Vec<Vec<String>>> {
        let nodes: Vec<&Vec<String>> = self.modules.keys().collect();
        let index_of: BTreeMap<&Vec<String>, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut next: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
        for (from, to) in self.edges.keys() {
            if let (Some(&a), Some(&b)) = (index_of.get(from), index_of.get(to)) {
                next[a].push(b);
            }
        }
        let mut tarjan = Tarjan {
            next: &next,
            index: vec![None; nodes.len()],
            low: vec![0; nodes.len()],
            on_stack: vec![false; nodes.len()],
            stack: Vec::new(),
            counter: 0,
            components: Vec::new(),
        };
        for v in 0..nodes.len() {
            if tarjan.index[v].is_none() {
                tarjan.visit(v);
            }
        }
        tarjan
            .components
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let mut c: Vec<Vec<String>> = c.into_iter().map(|i| nodes[i].clone()).collect();
                c.sort();
                c
            })
            .collect()
    }
}

struct Reexports {
    named: BTreeMap<(Vec<String>, String), Vec<String>>,
    globs: BTreeMap<Vec<String>, Vec<Vec<String>>>,
}

struct Tarjan<'a> {
    next: &'a [Vec<usize>],
    index: Vec<Option<usize>>,
    low: Vec<usize>,
    on_stack: Vec<bool>,
    stack: Vec<usize>,
    counter: usize,
    components: Vec<Vec<usize>>,
}

impl Tarjan<'_> {
    fn visit(&mut self, v: usize) {
        self.index[v] = Some(self.counter);
        self.low[v] = self.counter;
        self.counter += 1;
        self.stack.push(v);
        self.on_stack[v] = true;
        for &w in &self.next[v] {
            match self.index[w] {
                None => {
                    self.visit(w);
                    self.low[v] = self.low[v].min(self.low[w]);
                }
                Some(i) if self.on_stack[w] => self.low[v] = self.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(self.low[v]) == self.index[v] {
            let mut component = Vec::new();
            while let Some(w) = self.stack.pop() {
                self.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            self.components.push(component);
        }
    }
}

/// `crates/eval/src/run.rs` from a full path.
fn short(file: &Path) -> String {
    let s = file.to_string_lossy();
    ["crates/", "tests/", "xtask/"]
        .iter()
        .find_map(|k| s.find(k).map(|i| s[i..].to_string()))
        .unwrap_or_else(|| s.into_owned())
}

/// The floors a module's `//!` doc declares for its children, top first: the rows of the first
/// table whose header's first cell is `floor`, each row's backticked names in its first cell
/// (`run/`, `types.rs`, `run/mod.rs` and `run` all name the module `run`).
fn floor_table(text: &str) -> Option<Vec<Vec<String>>> {
    let doc: Vec<&str> = text
        .lines()
        .map_while(|l| {
            let l = l.trim_start();
            if l.is_empty() { Some("") } else { l.strip_prefix("//!").map(str::trim) }
        })
        .collect();
    let first_cell = |line: &str| line.strip_prefix('|').map(|r| r.split('|').next().unwrap_or("").trim().to_string());
    let header = doc.iter().position(|l| first_cell(l).is_some_and(|c| c.eq_ignore_ascii_case("floor")))?;
    let mut floors = Vec::new();
    // The header, then its `|---|` row, then one row per floor up to the table's end.
    for line in doc[header + 1..].iter().skip(1).take_while(|l| l.starts_with('|')) {
        let cell = first_cell(line).unwrap_or_default();
        let names: Vec<String> = cell
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|n| n.trim_end_matches("/mod.rs").trim_end_matches(".rs").trim_end_matches('/').to_string())
            .filter(|n| is_ident(n))
            .collect();
        floors.push(names);
    }
    Some(floors)
}

/// The code with comments removed and string and char literals emptied (kept as `""`), line
/// breaks kept so that line numbers stay true.
fn strip_comments_and_strings(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && !b.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match b.get(j) {
                    None => break,
                    Some('"') if (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some('\n') => out.push('\n'),
                    _ => {}
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if b.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a): only the former is skipped.
            let close = if next == Some('\\') {
                (i + 2..b.len().min(i + 12)).find(|&j| b[j] == '\'')
            } else if b.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(j) => {
                    out.push_str("' '");
                    i = j + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// The code without `#[cfg(test)]` items written inline (`mod tests { … }`, a test-only `use` or
/// function), line breaks kept.
fn strip_test_blocks(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        // The item ends at the first `;` before any `{`, or at the `}` closing its first `{`.
        let (mut depth, mut end) = (0usize, after.len());
        for (i, ch) in after.char_indices() {
            match ch {
                ';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.extend(after[..end].chars().filter(|&c| c == '\n'));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// The names in `mod NAME;` declarations (with any visibility).
fn mod_declarations(code: &str) -> Vec<String> {
    let words: Vec<&str> = code.split(|c: char| c.is_whitespace()).filter(|w| !w.is_empty()).collect();
    let mut out = Vec::new();
    for pair in words.windows(2) {
        if pair[0] == "mod"
            && let Some(name) = pair[1].strip_suffix(';')
            && is_ident(name)
        {
            out.push(name.to_string());
        }
    }
    out
}

/// The names a module's code defines: functions, types, traits, constants, statics, macros and
/// inline modules.
fn defined_items(code: &str) -> BTreeSet<String> {
    let tokens = tokens(code);
    let mut out = BTreeSet::new();
    for pair in tokens.windows(2) {
        let kind = pair[0].as_str();
        if matches!(
            kind,
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union" | "mod" | "macro_rules"
        ) && is_ident(&pair[1])
        {
            out.insert(pair[1].clone());
        }
    }
    out
}

/// Identifier and punctuation tokens (`macro_rules!` gives `macro_rules`).
fn tokens(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for ch in code.chars() {
        if ch.is_alphanumeric() || ch == '_' || ch == '$' {
            word.push(ch);
        } else {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            if !ch.is_whitespace() && ch != '!' {
                out.push(ch.to_string());
            }
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// A piece of code to scan for paths: a whole `use` statement (so that its braces expand), or
/// one line of anything else.
struct Statement {
    line: usize,
    text: String,
}

fn statements(code: &str) -> Vec<Statement> {
    let mut out = Vec::new();
    let mut pending: Option<Statement> = None;
    for (n, line) in code.lines().enumerate() {
        if let Some(s) = pending.as_mut() {
            s.text.push(' ');
            s.text.push_str(line);
            if line.contains(';') {
                out.extend(pending.take());
            }
            continue;
        }
        let trimmed = line.trim_start();
        let is_use = trimmed.starts_with("use ") || (trimmed.starts_with("pub") && trimmed.contains(" use "));
        if is_use && !line.contains(';') {
            pending = Some(Statement { line: n + 1, text: line.to_string() });
        } else {
            out.push(Statement { line: n + 1, text: line.to_string() });
        }
    }
    out.extend(pending);
    out
}

/// Whether a statement is a `pub use` / `pub(crate) use` / `pub(super) use`.
fn is_pub_use(text: &str) -> bool {
    let t = text.trim_start();
    t.starts_with("pub ") && t.split_whitespace().nth(1) == Some("use") || t.starts_with("pub(") && t.contains(") use ")
}

/// The paths a statement names: a `use` statement's expanded tree, else every `a::b::c` chain.
fn paths_in(text: &str) -> Vec<Vec<String>> {
    let t = text.trim_start();
    if t.starts_with("use ") || is_pub_use(t) {
        return use_tree_paths(t).into_iter().map(|(p, _)| p).collect();
    }
    let tokens = tokens(text);
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        // A chain starts at an identifier not preceded by `::` or `.`.
        let preceded = i >= 2 && tokens[i - 1] == ":" && tokens[i - 2] == ":" || i >= 1 && tokens[i - 1] == ".";
        if is_ident(tokens[i].trim_start_matches('$')) && !preceded {
            let mut path = vec![tokens[i].clone()];
            let mut j = i + 1;
            while j + 2 < tokens.len() + 1
                && tokens.get(j).is_some_and(|t| t == ":")
                && tokens.get(j + 1).is_some_and(|t| t == ":")
            {
                match tokens.get(j + 2) {
                    Some(t) if is_ident(t) => {
                        path.push(t.clone());
                        j += 3;
                    }
                    _ => break,
                }
            }
            if path.len() > 1 {
                out.push(path);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The leaves of a `use` tree: each full path, with its `as` alias.
fn use_tree_paths(text: &str) -> Vec<(Vec<String>, Option<String>)> {
    let start = match text.find("use ") {
        Some(i) => i + 4,
        None => return Vec::new(),
    };
    let body: String = text[start..].split(';').next().unwrap_or("").to_string();
    let tokens = tokens(&body);
    let mut out = Vec::new();
    let mut at = 0;
    expand(&tokens, &mut at, Vec::new(), &mut out);
    out
}

/// Expands one use tree from `tokens[*at..]` under `prefix`, up to a `,` or `}` at its level.
fn expand(tokens: &[String], at: &mut usize, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let mut path = prefix;
    while *at < tokens.len() {
        let t = tokens[*at].as_str();
        match t {
            ":" => *at += 1,
            "{" => {
                *at += 1;
                loop {
                    expand(tokens, at, path.clone(), out);
                    match tokens.get(*at).map(String::as_str) {
                        Some(",") => *at += 1,
                        Some("}") => {
                            *at += 1;
                            break;
                        }
                        _ => break,
                    }
                    if tokens.get(*at).map(String::as_str) == Some("}") {
                        *at += 1;
                        break;
                    }
                }
                return;
            }
            "," | "}" => break,
            "as" => {
                let alias = tokens.get(*at + 1).cloned();
                *at += 2;
                out.push((path, alias));
                return;
            }
            "*" => {
                path.push("*".to_string());
                *at += 1;
            }
            _ => {
                path.push(t.to_string());
                *at += 1;
            }
        }
    }
    if !path.is_empty() {
        out.push((path, None));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Graph {
        // One folder per call: tests run side by side.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("qdrift-cycles-{}-{call}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, text) in files {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        let g = Graph::read("t", &dir.join("lib.rs")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        g
    }

    fn edge_list(g: &Graph) -> Vec<String> {
        g.edges.keys().map(|(a, b)| format!("{} -> {}", display(a), display(b))).collect()
    }

    #[test]
    fn use_trees_expand_with_aliases_and_globs() {
        let paths = use_tree_paths("use crate::{a::{B, c::D as E}, f::*};");
        let shown: Vec<String> = paths
            .iter()
            .map(|(p, a)| format!("{}{}", p.join("::"), a.as_ref().map(|a| format!(" as {a}")).unwrap_or_default()))
            .collect();
        assert_eq!(shown, ["crate::a::B", "crate::a::c::D as E", "crate::f::*"]);
    }

    #[test]
    fn a_two_module_cycle_is_found_and_a_facade_is_not_an_edge() {
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\npub use a::A;\npub use b::B;\n/// crate::b::B in a comment\n"),
            ("a.rs", "use crate::b::B;\npub struct A;\n"),
            ("b.rs", "pub struct B;\nfn f() { let s = \"crate::a::A\"; crate::A; }\n"),
        ]);
        assert_eq!(edge_list(&g), ["a -> b", "b -> a"]);
        assert_eq!(g.cycles().len(), 1);
    }

    #[test]
    fn one_way_flow_has_no_cycle_and_test_blocks_are_ignored() {
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\nuse a::helper;\npub struct Error;\n"),
            (
                "a.rs",
                "pub fn helper() -> crate::Error { crate::Error }\n#[cfg(test)]\nmod tests { use crate::b::x; }\n",
            ),
            ("b.rs", "use super::a::helper;\npub fn x() {}\n"),
        ]);
        assert_eq!(edge_list(&g), ["(root) -> a", "a -> (root)", "b -> a"]);
        assert_eq!(g.cycles().len(), 1, "the root using a's helper while a uses the root's Error is a cycle");
    }

    #[test]
    fn suggested_floors_put_each_module_above_everything_it_imports() {
        let g = graph(&[
            ("lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\n"),
            ("a.rs", "use crate::b::x;\nuse crate::c::y;\n"),
            ("b.rs", "use crate::c::y;\npub fn x() {}\n"),
            ("c.rs", "pub fn y() {}\n"),
            ("d/mod.rs", "mod e;\n"),
            ("d/e.rs", "use crate::c::y;\n"),
        ]);
        assert_eq!(
            g.suggest_root_floors(),
            ["t: //! | floor |", "//! |---|", "//! | `a.rs` |", "//! | `b.rs`, `d/` |", "//! | `c.rs` |"]
        );
    }

    #[test]
    fn nested_modules_and_super_resolve() {
        let g = graph(&[
            ("lib.rs", "mod gguf;\n"),
            ("gguf/mod.rs", "mod read;\nmod write;\npub use read::Reader;\n"),
            ("gguf/read.rs", "pub struct Reader;\n"),
            ("gguf/write.rs", "use super::Reader;\nfn w(_: &Reader) {}\n"),
        ]);
        assert_eq!(edge_list(&g), ["gguf::write -> gguf::read"]);
        assert!(g.cycles().is_empty());
    }

    #[test]
    fn an_upward_import_is_reported_with_its_file_and_path() {
        let lib = "//! | floor | contents |\n//! |---|---|\n//! | `run/` | the top |\n//! | `types.rs` | below |\n\
                   //! | [`error`] | the bottom |\n\nmod error;\nmod run;\nmod types;\n";
        let g = graph(&[
            ("lib.rs", lib),
            ("run/mod.rs", "//! | floor |\n//! |---|\n//! | `go.rs` |\n//! | `texts.rs` |\nmod go;\nmod texts;\n"),
            ("run/go.rs", "use super::texts::T;\nuse crate::types::U;\n"),
            ("run/texts.rs", "pub struct T;\n"),
            ("types.rs", "pub struct U;\npub fn f() -> crate::error::E { crate::run::texts::T; crate::error::E }\n"),
            ("error.rs", "pub struct E;\n"),
        ]);
        assert!(g.cycles().is_empty());
        let upward = g.upward();
        assert_eq!(upward.len(), 1, "{upward:?}");
        assert!(upward[0].contains("types.rs:2: crate::run::texts::T: types imports run::texts"), "{upward:?}");
        assert!(upward[0].contains("on a higher floor of") && upward[0].ends_with("lib.rs's table"), "{upward:?}");
    }

    #[test]
    fn a_floor_table_must_name_every_child_and_only_children() {
        let g = graph(&[
            ("lib.rs", "//! | floor |\n//! |---|\n//! | `a.rs` |\n//! | `gone.rs` |\nmod a;\nmod b;\n"),
            ("a.rs", "use crate::b::B;\n"),
            ("b.rs", "pub struct B;\n"),
        ]);
        let upward = g.upward();
        assert_eq!(upward.len(), 2, "{upward:?}");
        assert!(upward.iter().any(|u| u.contains("module b is on no floor")), "{upward:?}");
        assert!(upward.iter().any(|u| u.contains("names gone, which is no module")), "{upward:?}");
    }

    #[test]
    fn floor_tables_read_folders_files_links_and_shared_floors() {
        let doc = "//! Intro.\n//!\n//! | file | x |\n//! |---|---|\n//! | `z.rs` | |\n//!\n\
                   //! | floor | contents |\n//! |---|---|\n//! | `run/` | |\n//! | `a.rs`, [`b`] | |\n//! | `c/mod.rs` | |\n\
                   //! after\nmod a;\n";
        let floors = floor_table(doc).expect("a table");
        assert_eq!(floors, [vec!["run"], vec!["a", "b"], vec!["c"]]);
        assert!(floor_table("//! | file |\n//! |---|\n//! | `a.rs` |\nmod a;\n").is_none());
    }
}
