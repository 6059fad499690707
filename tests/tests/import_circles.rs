//! No import circles between the project's files.
//!
//! Builds the graph of every library crate's source files: an edge from a
//! file to each file it names through a `use`, a `crate::`, `super::` or
//! `self::` path (through `pub use` re-exports to the file that defines the
//! item: a re-export itself is no edge), and to the file defining a type
//! it writes an `impl` for. A
//! circle (a strongly connected set of more than one file) fails the test
//! and is printed. Files reached only by `mod` declarations make no
//! circle, nor do `#[cfg(test)]` modules: a test reads everything.
//!
//! Run alone: `cargo test -p throttle-tests --test import_circles`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The library crates, by directory.
const CRATES: &[&str] = &[
    "clock",
    "proto",
    "core",
    "throttle-layer",
    "throttle-central",
    "examples",
    "tests/servers",
    "tests",
];

/// One crate's files: module path -> file, and what each file holds.
struct Crate {
    modules: BTreeMap<Vec<String>, PathBuf>,
    files: BTreeMap<PathBuf, Source>,
}

/// What the graph needs of one file.
#[derive(Default)]
struct Source {
    module: Vec<String>,
    /// Paths it names, each with the module it is written in.
    paths: Vec<(Vec<String>, String)>,
    /// Names of items it re-exports, with the path of each (and the
    /// module it is written in).
    reexports: BTreeMap<String, (Vec<String>, String)>,
    /// Types it defines.
    defines: BTreeSet<String>,
    /// Types it writes an `impl` for.
    impls: BTreeSet<String>,
}

#[test]
fn no_file_imports_one_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut circles = Vec::new();
    for dir in CRATES {
        let src = root.join(dir).join("src");
        if !src.join("lib.rs").exists() {
            continue;
        }
        let krate = read_crate(&src);
        let graph = edges(&krate);
        for circle in strongly_connected(&graph) {
            let names: Vec<String> = circle
                .iter()
                .map(|f| f.strip_prefix(&root).unwrap_or(f).display().to_string())
                .collect();
            circles.push(names.join(" <-> "));
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// A circle made on purpose is found: two files naming each other.
#[test]
fn a_circle_of_two_files_is_found() {
    let mut krate = Crate {
        modules: BTreeMap::new(),
        files: BTreeMap::new(),
    };
    for (name, text) in [
        ("a", "use super::b::B;\npub struct A;\n"),
        ("b", "pub struct B;\nimpl crate::a::A { fn f() {} }\n"),
        ("c", "use crate::a::A;\n"),
    ] {
        let module = vec![name.to_owned()];
        let file = PathBuf::from(format!("{name}.rs"));
        krate.modules.insert(module.clone(), file.clone());
        krate.files.insert(file, parse(text, module));
    }
    let graph = edges(&krate);
    let found = strongly_connected(&graph);
    assert_eq!(found.len(), 1, "{:?}", found);
    let names: Vec<_> = found[0].iter().map(|p| p.display().to_string()).collect();
    assert_eq!(names, ["a.rs", "b.rs"]);
}

fn read_crate(src: &Path) -> Crate {
    let mut krate = Crate {
        modules: BTreeMap::new(),
        files: BTreeMap::new(),
    };
    let mut stack = vec![(src.to_path_buf(), Vec::<String>::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                if prefix.is_empty() && name == "bin" {
                    continue;
                }
                let mut module = prefix.clone();
                module.push(name);
                stack.push((path, module));
                continue;
            }
            let Some(stem) = name.strip_suffix(".rs") else {
                continue;
            };
            let mut module = prefix.clone();
            if !(matches!(stem, "mod") || (prefix.is_empty() && matches!(stem, "lib" | "main"))) {
                module.push(stem.to_owned());
            }
            if prefix.is_empty() && stem == "main" {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            krate.modules.insert(module.clone(), path.clone());
            krate.files.insert(path, parse(&text, module));
        }
    }
    krate
}

/// Reads a file's `use` statements, inline paths, definitions and impls;
/// those of an inline `mod name { ... }` as its module's.
fn parse(text: &str, module: Vec<String>) -> Source {
    let mut source = Source {
        module,
        ..Source::default()
    };
    read_into(&mut source, &strip_comments(text));
    source
}

fn read_into(source: &mut Source, code: &str) {
    let (code, inline) = inline_modules(code);
    for (name, body) in inline {
        let mut inner = Source {
            module: [source.module.clone(), vec![name]].concat(),
            ..Source::default()
        };
        read_into(&mut inner, &body);
        source.paths.extend(inner.paths);
        source.impls.extend(inner.impls);
    }
    let code = code.as_str();
    for statement in use_statements(code) {
        let public = statement.starts_with("pub");
        let body = statement.split_once("use ").map_or("", |(_, b)| b);
        for path in expand(body.trim().trim_end_matches(';')) {
            let (path, alias) = match path.split_once(" as ") {
                Some((p, a)) => (p.trim().to_owned(), Some(a.trim().to_owned())),
                None => (path, None),
            };
            let last = path.rsplit("::").next().map(str::to_owned);
            // A re-export is a door to the item's file, followed by those
            // who name it there, not a use of the file that makes it.
            if public {
                if let Some(name) = alias.or(last) {
                    source.reexports.insert(name, (source.module.clone(), path));
                }
                continue;
            }
            source.paths.push((source.module.clone(), path));
        }
    }
    for word in inline_paths(code) {
        source.paths.push((source.module.clone(), word));
    }
    source.defines.extend(definitions(code));
    source.impls.extend(impls(code));
}

/// `code` without its inline `mod name { ... }` blocks, and those blocks.
fn inline_modules(code: &str) -> (String, Vec<(String, String)>) {
    let mut out = String::new();
    let mut blocks = Vec::new();
    let mut rest = code;
    while let Some(at) = find_word(rest, "mod") {
        let after = &rest[at + 3..];
        let name: String = after
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let tail = after.trim_start()[name.len()..].trim_start();
        if name.is_empty() || !tail.starts_with('{') {
            out.push_str(&rest[..at + 3]);
            rest = after;
            continue;
        }
        let open = rest.len() - tail.len();
        let mut depth = 0;
        let mut close = rest.len();
        for (i, c) in rest[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = open + i;
                        break;
                    }
                }
                _ => {}
            }
        }
        out.push_str(&rest[..at]);
        if !rest[..at].trim_end().ends_with("#[cfg(test)]") {
            blocks.push((name, rest[open + 1..close].to_owned()));
        }
        rest = rest.get(close + 1..).unwrap_or("");
    }
    out.push_str(rest);
    (out, blocks)
}

/// The text with `//` and `/* */` comments and string literals blanked.
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '/' if chars.peek() == Some(&'*') => {
                chars.next();
                let mut last = ' ';
                for c in chars.by_ref() {
                    if last == '*' && c == '/' {
                        break;
                    }
                    last = c;
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if c == '"' && !escaped {
                        break;
                    }
                    escaped = c == '\\' && !escaped;
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// Every `use ...;` statement, on one line, with its visibility.
fn use_statements(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let flat = code.replace('\n', " ");
    let mut rest = flat.as_str();
    while let Some(at) = find_word(rest, "use") {
        let start = visibility_start(rest, at);
        let Some(end) = rest[at..].find(';') else {
            break;
        };
        out.push(rest[start..at + end].trim().to_owned());
        rest = &rest[at + end + 1..];
    }
    out
}

/// Where `word` starts in `text` as a whole word followed by a space.
fn find_word(text: &str, word: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = text[from..].find(word) {
        let at = from + i;
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        let alone = before.is_none_or(|c| !c.is_alphanumeric() && c != '_');
        if alone && after == Some(' ') {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// Where a `use` at `at` starts, its `pub`, `pub(crate)` or `pub(super)`
/// included.
fn visibility_start(text: &str, at: usize) -> usize {
    let before = text[..at].trim_end();
    for vis in ["pub(crate)", "pub(super)", "pub"] {
        if before.ends_with(vis) {
            return before.len() - vis.len();
        }
    }
    at
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        return vec![tree.to_owned()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            let p = if p == "self" {
                prefix.trim_end_matches("::").to_owned()
            } else {
                format!("{prefix}{p}")
            };
            expand(&p)
        })
        .collect()
}

/// Paths written in code: `crate::a::b`, `super::a`, `self::a::B`.
fn inline_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(start) {
            let at = from + i;
            let before = code[..at].chars().next_back();
            from = at + start.len();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let end = code[at..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .map_or(code.len(), |e| at + e);
            out.push(code[at..end].trim_end_matches(':').to_owned());
        }
    }
    out
}

/// `path` (as written in module `module`) from the crate root; `None` for
/// another crate's, or an item's.
fn absolute(krate: &Crate, module: &[String], path: &str) -> Option<Vec<String>> {
    let mut segments = path.split("::").map(str::trim).filter(|s| !s.is_empty());
    let first = segments.next()?;
    let mut out: Vec<String> = match first {
        "crate" => Vec::new(),
        "self" => module.to_vec(),
        "super" => module[..module.len().checked_sub(1)?].to_vec(),
        child => {
            let within = [module, &[child.to_owned()]].concat();
            if !krate.modules.contains_key(&within) {
                return None;
            }
            within
        }
    };
    for s in segments {
        if s == "super" {
            out.pop()?;
        } else {
            out.push(s.to_owned());
        }
    }
    Some(out)
}

/// Names after `struct`, `enum`, `trait`, `type` and `union` items at the
/// top of the file (rustfmt writes them from the first column; an
/// associated `type Future = ...` is indented).
fn definitions(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in code.lines().filter(|l| !l.starts_with(char::is_whitespace)) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let Some(k) = words
            .iter()
            .position(|w| ["struct", "enum", "trait", "type", "union"].contains(w))
        else {
            continue;
        };
        out.extend(type_name(words.get(k + 1).unwrap_or(&"")));
    }
    out
}

/// The types of `impl Type` and `impl Trait for Type` blocks at the top
/// of the file.
fn impls(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("\nimpl") {
        let after = &rest[at + 5..];
        rest = after;
        if !after.starts_with([' ', '<']) {
            continue;
        }
        let end = after
            .find('{')
            .unwrap_or(after.len())
            .min(after.find(';').unwrap_or(after.len()));
        let head = skip_generics(after[..end].trim_start());
        let target = head.rsplit_once(" for ").map_or(head, |(_, t)| t);
        let target = target.split(" where ").next().unwrap_or(target);
        let target = skip_generics(target.trim()).trim_start_matches('&');
        let name = target
            .split('<')
            .next()
            .unwrap_or("")
            .rsplit("::")
            .next()
            .unwrap_or("");
        out.extend(type_name(name));
    }
    out
}

/// The identifier `text` starts with, if it names a type (an uppercase
/// first letter).
fn type_name(text: &str) -> Option<String> {
    let name: String = (text.chars())
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    name.chars()
        .next()
        .is_some_and(char::is_uppercase)
        .then_some(name)
}

/// `text` after a leading `<...>`.
fn skip_generics(text: &str) -> &str {
    if !text.starts_with('<') {
        return text;
    }
    let mut depth = 0;
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    return &text[i + 1..];
                }
            }
            _ => {}
        }
    }
    text
}

/// The file an absolute path names: the longest module prefix with a file,
/// followed through that file's re-export of the next name.
fn target<'a>(krate: &'a Crate, path: &[String], depth: usize) -> Option<&'a PathBuf> {
    let n = (0..=path.len())
        .rev()
        .find(|&n| krate.modules.contains_key(&path[..n]))?;
    let file = &krate.modules[&path[..n]];
    if depth < 8
        && let Some(name) = path.get(n)
        && let Some((module, raw)) = krate.files[file].reexports.get(name)
        && let Some(to) = absolute(krate, module, raw)
        && to.as_slice() != path
    {
        let mut next = to;
        next.extend(path[n + 1..].iter().cloned());
        return target(krate, &next, depth + 1).or(Some(file));
    }
    Some(file)
}

fn edges(krate: &Crate) -> BTreeMap<&PathBuf, BTreeSet<&PathBuf>> {
    let mut owners: BTreeMap<&str, Vec<&PathBuf>> = BTreeMap::new();
    for (file, source) in &krate.files {
        for name in &source.defines {
            owners.entry(name).or_default().push(file);
        }
    }
    let mut graph: BTreeMap<&PathBuf, BTreeSet<&PathBuf>> = BTreeMap::new();
    for (file, source) in &krate.files {
        let out = graph.entry(file).or_default();
        for (module, raw) in &source.paths {
            let absolute = absolute(krate, module, raw);
            if let Some(to) = absolute.and_then(|path| target(krate, &path, 0)) {
                out.insert(to);
            }
        }
        for name in &source.impls {
            if source.defines.contains(name) {
                continue;
            }
            if let Some([only]) = owners.get(name.as_str()).map(Vec::as_slice) {
                out.insert(only);
            }
        }
        out.remove(file);
    }
    graph
}

/// The strongly connected sets of more than one file (Tarjan's algorithm).
fn strongly_connected<'a>(
    graph: &BTreeMap<&'a PathBuf, BTreeSet<&'a PathBuf>>,
) -> Vec<Vec<&'a PathBuf>> {
    struct State<'a> {
        index: BTreeMap<&'a PathBuf, usize>,
        low: BTreeMap<&'a PathBuf, usize>,
        stack: Vec<&'a PathBuf>,
        on_stack: BTreeSet<&'a PathBuf>,
        found: Vec<Vec<&'a PathBuf>>,
    }
    fn visit<'a>(
        v: &'a PathBuf,
        graph: &BTreeMap<&'a PathBuf, BTreeSet<&'a PathBuf>>,
        st: &mut State<'a>,
    ) {
        let i = st.index.len();
        st.index.insert(v, i);
        st.low.insert(v, i);
        st.stack.push(v);
        st.on_stack.insert(v);
        for &w in graph.get(v).into_iter().flatten() {
            if !st.index.contains_key(w) {
                visit(w, graph, st);
                let low = st.low[v].min(st.low[w]);
                st.low.insert(v, low);
            } else if st.on_stack.contains(w) {
                let low = st.low[v].min(st.index[w]);
                st.low.insert(v, low);
            }
        }
        if st.low[v] == st.index[v] {
            let mut set = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(w);
                set.push(w);
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                set.sort();
                st.found.push(set);
            }
        }
    }
    let mut st = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for &v in graph.keys() {
        if !st.index.contains_key(v) {
            visit(v, graph, &mut st);
        }
    }
    st.found
}
