//! Code shape: no function in `src/` over 120 lines, no file over 800 (issue 32 brought
//! them under, issue 48 found them grown back). A function's length runs from its `fn`
//! keyword to its closing brace, as an editor shows it; a file's is its line count.

use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

const MAX_FN_LINES: usize = 120;
const MAX_FILE_LINES: usize = 800;

/// Files allowed over the limit for now, each with its reason. Empty when the code holds.
const ALLOWED_FILES: &[&str] = &[];
/// Functions (`file:name`) allowed over the limit for now, each with its reason.
const ALLOWED_FNS: &[&str] = &[];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

struct Lengths {
    found: Vec<(String, usize, usize)>,
}

impl Lengths {
    fn record(&mut self, name: String, from: proc_macro2::Span, block: &syn::Block) {
        let start = from.start().line;
        let end = block.span().end().line;
        self.found.push((name, start, end + 1 - start));
    }
}

impl<'ast> Visit<'ast> for Lengths {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.record(f.sig.ident.to_string(), f.sig.fn_token.span, &f.block);
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.record(f.sig.ident.to_string(), f.sig.fn_token.span, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(block) = &f.default {
            self.record(f.sig.ident.to_string(), f.sig.fn_token.span, block);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

/// Every function and file of `src/` over its limit, one line each.
fn oversized(root: &Path) -> Vec<String> {
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(!files.is_empty(), "no Rust files under {}", src.display());
    let mut out = Vec::new();
    for path in files {
        let rel = path.strip_prefix(root).unwrap().display().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines = text.lines().count();
        if lines > MAX_FILE_LINES && !ALLOWED_FILES.contains(&rel.as_str()) {
            out.push(format!("{rel}: {lines} lines (at most {MAX_FILE_LINES})"));
        }
        let ast = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let mut v = Lengths { found: Vec::new() };
        v.visit_file(&ast);
        for (name, line, n) in v.found {
            let key = format!("{rel}:{name}");
            if n > MAX_FN_LINES && !ALLOWED_FNS.contains(&key.as_str()) {
                out.push(format!(
                    "{rel}:{line}: fn {name} is {n} lines (at most {MAX_FN_LINES})"
                ));
            }
        }
    }
    out
}

#[test]
fn no_function_over_120_lines_and_no_file_over_800() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let over = oversized(root);
    assert!(
        over.is_empty(),
        "split these (a function of its own per step, a file per subject):\n{}",
        over.join("\n")
    );
}

#[test]
fn the_size_check_sees_an_oversized_function_and_file() {
    let dir = std::env::temp_dir().join(format!("cibox-sizes-{}", std::process::id()));
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    let body: String = (0..130)
        .map(|i| format!("    let _x{i} = {i};\n"))
        .collect();
    std::fs::write(src.join("long.rs"), format!("fn long() {{\n{body}}}\n")).unwrap();
    let filler: String = (0..801).map(|i| format!("const C{i}: u8 = 0;\n")).collect();
    std::fs::write(src.join("big.rs"), filler).unwrap();
    let over = oversized(&dir);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        over,
        vec![
            "src/big.rs: 801 lines (at most 800)".to_string(),
            "src/long.rs:1: fn long is 132 lines (at most 120)".to_string(),
        ]
    );
}
