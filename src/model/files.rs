//! Finding the YAML and JSON files under a directory: one walk for policies (`allot serve`,
//! `allot check --policies`), manifests (`allot check DIR`) and test files (`allot test DIR`).

use std::path::{Path, PathBuf};

/// Every `.yaml`, `.yml` and `.json` file under `dir`, recursively, sorted. Symlinks are
/// followed (ConfigMap volumes are symlinks into `..data/`); hidden entries are skipped (that
/// `..data` farm itself, `.git`, editors' swap files), so nothing is read twice.
pub fn yaml_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    collect(dir, &mut files)?;
    files.sort();
    Ok(files)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        if std::fs::metadata(&path)?.is_dir() {
            collect(&path, out)?;
        } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")) {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn finds_yaml_recursively_sorted_and_skips_hidden_entries() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("b/c")).unwrap();
        std::fs::create_dir_all(d.join("..2026_11_22")).unwrap();
        for f in ["b/c/z.yaml", "a.json", "b/x.yml", "notes.txt", ".hidden.yaml", "..2026_11_22/a.yaml"] {
            std::fs::write(d.join(f), "").unwrap();
        }
        #[cfg(unix)]
        std::os::unix::fs::symlink(d.join("..2026_11_22/a.yaml"), d.join("linked.yaml")).unwrap();
        let found: Vec<String> =
            super::yaml_files(d).unwrap().iter().map(|p| p.strip_prefix(d).unwrap().display().to_string()).collect();
        let mut want = vec!["a.json", "b/c/z.yaml", "b/x.yml"];
        if cfg!(unix) {
            want.push("linked.yaml");
        }
        want.sort();
        assert_eq!(found, want);
    }
}
