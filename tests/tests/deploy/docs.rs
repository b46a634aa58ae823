//! The documentation's links: every relative link of the README, the CHANGELOG, `docs/` and the tests' README
//! names a file or directory of the repository, and every `#anchor` into a Markdown file names one of its headings.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the tests crate is in the workspace").to_path_buf()
}

/// The Markdown files whose links are checked.
fn documents() -> Vec<PathBuf> {
    let root = repo();
    let mut files: Vec<PathBuf> =
        ["README.md", "CHANGELOG.md", "tests/README.md"].iter().map(|f| root.join(f)).collect();
    let docs = std::fs::read_dir(root.join("docs")).expect("docs/");
    files.extend(docs.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "md")));
    files.sort();
    files
}

/// The targets of the inline links `[text](target)` of `markdown`, outside code blocks and code spans.
fn links(markdown: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut in_code = false;
        let mut rest = line;
        while let Some(i) = rest.find(['`', ']']) {
            let (c, after) = (rest.as_bytes()[i], &rest[i + 1..]);
            if c == b'`' {
                in_code = !in_code;
            } else if !in_code
                && let Some(target) = after.strip_prefix('(')
                && let Some(end) = target.find(')')
            {
                found.push(target[..end].split_whitespace().next().unwrap_or_default().to_string());
            }
            rest = after;
        }
    }
    found
}

/// GitHub's anchors of the headings of `markdown`: lower case, punctuation dropped, spaces as hyphens.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !fenced) else { continue };
        let text = heading.trim_start_matches('#').trim();
        let anchor: String = text
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        found.insert(anchor);
    }
    found
}

#[test]
fn every_relative_link_of_the_documentation_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("read {}: {e}", doc.display()));
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") || link.is_empty() {
                continue;
            }
            checked += 1;
            let (path, anchor) = link.split_once('#').map_or((link.as_str(), None), |(p, a)| (p, Some(a)));
            let target = if path.is_empty() { doc.clone() } else { doc.parent().expect("a directory").join(path) };
            if !target.exists() {
                broken.push(format!("{}: {link} (no {})", doc.display(), target.display()));
                continue;
            }
            if let Some(anchor) = anchor.filter(|_| target.extension().is_some_and(|x| x == "md")) {
                let headings = anchors(&std::fs::read_to_string(&target).expect("read the target"));
                if !headings.contains(anchor) {
                    broken.push(format!("{}: {link} (no heading #{anchor} in {})", doc.display(), target.display()));
                }
            }
        }
    }
    assert!(checked > 20, "the links were found: {checked}");
    assert!(broken.is_empty(), "links that do not resolve:\n{}", broken.join("\n"));
}

#[test]
fn the_link_reader_finds_links_and_skips_code() {
    let text = "see [a](a.md) and `[b](b.md)`, [c](c.md#x \"title\")\n```\n[d](d.md)\n```\n[e](#own)";
    assert_eq!(links(text), ["a.md", "c.md#x", "#own"]);
    assert!(anchors("# The node agent\n## Warm reserve (opt-in)\n").contains("warm-reserve-opt-in"));
}
