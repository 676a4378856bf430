//! The rules every error type of the workspace follows, checked on the source of all crates:
//!
//! 1. An error's message does not repeat its source: the source is printed by whoever prints
//!    the chain (`ErrorChain`, the binary's last line), and a message that quotes it shows it
//!    twice there.
//! 2. No cause is kept as text: a field that says why something failed (`reason`, `cause`,
//!    `error`, `message`) is not a `String`. The underlying error is kept whole (as a `source`,
//!    or a `Cause`), so a caller can walk to it and downcast it. Text that *describes* what is
//!    wrong (a corrupt record, a bad value) is named for what it is (`what`) and allowed.
//! 3. Public error enums are `#[non_exhaustive]`: a new failure is not a breaking change.
//!
//! Each rule was seen to fail on a planted violation (a `{source}` put back into a message, a
//! `reason: String` field, a `#[non_exhaustive]` removed).
// covers: Rt.ErrorSources

use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Crates whose error types are checked.
const ROOTS: [&str; 5] = [
    "core/src",
    "runtime/src",
    "adapters/src",
    "sequencer/src",
    "src",
];
/// Field names that hold why something failed.
const CAUSE_NAMES: [&str; 4] = ["reason", "cause", "error", "message"];
/// Fields allowed to hold text under a cause name, with why.
const ALLOWED_TEXT: [(&str, &str); 1] = [
    // The message a service gives its own failure; the underlying error is its `source`.
    ("ServiceError", "message"),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            out.push(path);
        }
    }
}

/// Whether the item derives `Error` (thiserror's).
fn derives_error(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("derive") && {
            let mut found = false;
            let _ = attr.parse_nested_meta(|meta| {
                found |= meta
                    .path
                    .segments
                    .last()
                    .is_some_and(|s| s.ident == "Error");
                Ok(())
            });
            found
        }
    })
}

fn has_attr(attrs: &[syn::Attribute], name: &str) -> bool {
    attrs.iter().any(|attr| attr.path().is_ident(name))
}

/// The tokens of `#[error(...)]`, unless it is `transparent`.
fn error_format(attrs: &[syn::Attribute]) -> Option<String> {
    let attr = attrs.iter().find(|attr| attr.path().is_ident("error"))?;
    let syn::Meta::List(list) = &attr.meta else {
        return None;
    };
    let tokens = list.tokens.to_string();
    (tokens != "transparent").then_some(tokens)
}

/// The name by which the format refers to the source field, if the fields have one.
fn source_field(fields: &syn::Fields) -> Option<String> {
    fields.iter().enumerate().find_map(|(index, field)| {
        let named = field.ident.as_ref().map(ToString::to_string);
        let marked = has_attr(&field.attrs, "source") || has_attr(&field.attrs, "from");
        match named {
            Some(name) if marked || name == "source" => Some(name),
            None if marked => Some(index.to_string()),
            _ => None,
        }
    })
}

fn is_text(ty: &syn::Type) -> bool {
    let syn::Type::Path(path) = ty else {
        return false;
    };
    path.path
        .segments
        .last()
        .is_some_and(|s| s.ident == "String" || s.ident == "Cow")
}

#[derive(Default)]
struct Check {
    file: String,
    errors_seen: usize,
    violations: Vec<String>,
}

impl Check {
    fn fields(&mut self, owner: &str, format: Option<String>, fields: &syn::Fields) {
        if let (Some(format), Some(source)) = (format, source_field(fields)) {
            // In the tokens, a format string's `{source}` or `{0:?}` and an argument's `.source`
            // or `.0` all name the field.
            let quoted = [
                format!("{{{source}}}"),
                format!("{{{source}:"),
                format!(". {source}"),
                format!(".{source}"),
            ];
            if quoted.iter().any(|q| format.contains(q.as_str())) {
                self.violations.push(format!(
                    "{}: {owner}: the message repeats its source `{source}`: {format}",
                    self.file
                ));
            }
        }
        for field in fields {
            let Some(name) = field.ident.as_ref().map(ToString::to_string) else {
                continue;
            };
            let allowed = ALLOWED_TEXT
                .iter()
                .any(|(o, f)| owner.starts_with(o) && *f == name);
            if CAUSE_NAMES.contains(&name.as_str()) && is_text(&field.ty) && !allowed {
                self.violations.push(format!(
                    "{}: {owner}: field `{name}` keeps a cause as text",
                    self.file
                ));
            }
        }
    }
}

impl<'ast> Visit<'ast> for Check {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // Tests define errors of their own to exercise printing; they are not the workspace's.
        let test_only = item.attrs.iter().any(|attr| {
            attr.path().is_ident("cfg")
                && attr
                    .parse_args::<syn::Path>()
                    .is_ok_and(|path| path.is_ident("test"))
        });
        if !test_only {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item_enum(&mut self, item: &'ast syn::ItemEnum) {
        if derives_error(&item.attrs) {
            self.errors_seen += 1;
            let public = matches!(item.vis, syn::Visibility::Public(_));
            if public && !has_attr(&item.attrs, "non_exhaustive") {
                self.violations.push(format!(
                    "{}: public error enum {} is not #[non_exhaustive]",
                    self.file, item.ident
                ));
            }
            for variant in &item.variants {
                let owner = format!("{}::{}", item.ident, variant.ident);
                self.fields(&owner, error_format(&variant.attrs), &variant.fields);
            }
        }
        syn::visit::visit_item_enum(self, item);
    }

    fn visit_item_struct(&mut self, item: &'ast syn::ItemStruct) {
        if derives_error(&item.attrs) {
            self.errors_seen += 1;
            let owner = item.ident.to_string();
            self.fields(&owner, error_format(&item.attrs), &item.fields);
        }
        syn::visit::visit_item_struct(self, item);
    }
}

fn check_sources(roots: &[PathBuf]) -> Check {
    let mut files = Vec::new();
    for root in roots {
        rust_files(root, &mut files);
    }
    files.sort();
    let mut check = Check::default();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        check.file = path.display().to_string();
        check.visit_file(&file);
    }
    check
}

#[test]
fn error_types_keep_their_sources_and_do_not_repeat_them() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let roots: Vec<PathBuf> = ROOTS.iter().map(|root| workspace.join(root)).collect();
    let check = check_sources(&roots);
    // The scan must have seen the workspace's error types, or it checked nothing.
    assert!(
        check.errors_seen >= 30,
        "only {} error types found",
        check.errors_seen
    );
    assert!(
        check.violations.is_empty(),
        "{} violations:\n{}",
        check.violations.len(),
        check.violations.join("\n")
    );
}

/// The check itself: each rule catches a planted violation.
#[test]
fn each_rule_catches_a_planted_violation() {
    let dir = std::env::temp_dir().join(format!("vvm-error-rules-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let planted = [
        (
            "repeats.rs",
            "#[derive(Debug, thiserror::Error)] #[non_exhaustive] pub enum E { \
             #[error(\"cannot open: {source}\")] Open { source: std::io::Error } }",
            "repeats its source",
        ),
        (
            "repeats_tuple.rs",
            "#[derive(Debug, thiserror::Error)] #[non_exhaustive] pub enum E { \
             #[error(\"cannot open: {0}\")] Open(#[from] std::io::Error) }",
            "repeats its source",
        ),
        (
            "repeats_arg.rs",
            "#[derive(Debug, thiserror::Error)] \
             #[error(\"cannot open: {}\", .inner)] pub struct E { #[source] inner: std::io::Error }",
            "repeats its source",
        ),
        (
            "text.rs",
            "#[derive(Debug, thiserror::Error)] #[non_exhaustive] pub enum E { \
             #[error(\"failed\")] Failed { reason: String } }",
            "keeps a cause as text",
        ),
        (
            "open.rs",
            "#[derive(Debug, thiserror::Error)] pub enum E { #[error(\"failed\")] Failed }",
            "not #[non_exhaustive]",
        ),
    ];
    for (name, source, expected) in planted {
        let case = dir.join(name.trim_end_matches(".rs"));
        std::fs::create_dir_all(&case).unwrap();
        std::fs::write(case.join(name), source).unwrap();
        let check = check_sources(std::slice::from_ref(&case));
        assert_eq!(check.errors_seen, 1, "{name}");
        assert!(
            check.violations.len() == 1 && check.violations[0].contains(expected),
            "{name}: {:?}",
            check.violations
        );
    }
    // And a well-formed error passes.
    let good = dir.join("good");
    std::fs::create_dir_all(&good).unwrap();
    std::fs::write(
        good.join("good.rs"),
        "#[derive(Debug, thiserror::Error)] #[non_exhaustive] pub enum E { \
         #[error(\"cannot open {path}\")] Open { path: String, source: std::io::Error }, \
         #[error(\"damaged: {what}\")] Damaged { what: String } }",
    )
    .unwrap();
    let check = check_sources(&[good]);
    assert_eq!(
        (check.errors_seen, check.violations.len()),
        (1, 0),
        "{:?}",
        check.violations
    );
    let _ = std::fs::remove_dir_all(&dir);
}
