//! Per-tenant read-only assets, held in memory and shown to guests as the preopened WASI
//! directory `/assets` (see [`crate::guest::module::fs`]).
//!
//! Assets come from a directory named in the config file or a tar archive uploaded through the
//! admin API. They are read once, at load time, into one immutable tree shared by every request
//! of the tenant on every worker thread, so a guest's `std::fs::read("/assets/index.html")`
//! is a memory copy: no disk I/O and no hand-off to another thread at request time. The tree
//! holds only directories and regular files: archives with links, devices, absolute paths or
//! `..` components are refused when they are deployed, and guest paths are resolved inside the
//! tree, so nothing can name a file outside it.

use std::collections::HashMap;
use std::path::Path;

use bytes::Bytes;

/// The directory guests see the assets under.
pub const GUEST_DIR: &str = "/assets";
/// Most entries (files and directories) in one tenant's assets.
pub const MAX_ENTRIES: usize = 10_000;
/// Longest path inside the assets, in bytes.
pub const MAX_PATH: usize = 1024;

/// Why assets could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AssetsError {
    /// The archive is not a readable tar archive.
    #[error("assets archive is not a valid tar archive: {0}")]
    NotTar(String),
    /// A path that could escape the assets or is not a plain relative path.
    #[error("assets: {path:?}: {reason}")]
    BadPath {
        /// The entry's path.
        path: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A symlink, hard link, device or other non-regular entry.
    #[error("assets: {path:?} is a {kind}; assets may hold only regular files and directories")]
    NotRegular {
        /// The entry's path.
        path: String,
        /// What it is.
        kind: String,
    },
    /// More entries or bytes than allowed.
    #[error("assets: {0}")]
    TooLarge(String),
    /// An archive with no files in it (an empty upload, or a tar of nothing).
    #[error("assets archive holds no files")]
    Empty,
    /// A directory could not be read.
    #[error("assets: {path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// One file or directory.
#[derive(Debug)]
pub struct Node {
    /// Its name in its directory (empty for the root).
    pub name: String,
    /// Its parent (the root is its own parent).
    pub parent: usize,
    /// What it is.
    pub kind: NodeKind,
}

/// A file's contents or a directory's entries.
#[derive(Debug)]
pub enum NodeKind {
    /// A directory: its entries' node indices, sorted by name.
    Dir(Vec<usize>),
    /// A regular file.
    File(Bytes),
}

/// An immutable in-memory directory tree. Node `0` is the root; a node's index is its inode.
#[derive(Debug)]
pub struct Assets {
    nodes: Vec<Node>,
    /// `a/b.txt` → node index, for every node but the root.
    index: HashMap<String, usize>,
    bytes: u64,
}

/// Why a guest path could not be resolved, as the WASI errno to return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// No such entry (`ENOENT`).
    NotFound,
    /// A path component that is a file is used as a directory (`ENOTDIR`).
    NotDir,
    /// The path is absolute or climbs out of the directory (`ENOTCAPABLE`).
    Escape,
}

impl Assets {
    fn empty() -> Self {
        Self {
            nodes: vec![Node {
                name: String::new(),
                parent: 0,
                kind: NodeKind::Dir(Vec::new()),
            }],
            index: HashMap::new(),
            bytes: 0,
        }
    }

    /// Reads a tar archive into memory.
    ///
    /// # Errors
    /// If the archive is unreadable, has an entry that is not a file or directory, a path that
    /// is absolute or has `..`, or more than `max_bytes` of files or [`MAX_ENTRIES`] entries.
    pub fn from_tar(archive: &[u8], max_bytes: u64) -> Result<Self, AssetsError> {
        use std::io::Read;
        let not_tar = |e: std::io::Error| AssetsError::NotTar(e.to_string());
        let mut assets = Self::empty();
        let mut ar = tar::Archive::new(archive);
        for entry in ar.entries().map_err(not_tar)? {
            let mut entry = entry.map_err(not_tar)?;
            let raw = entry.path_bytes();
            let path = String::from_utf8_lossy(&raw).into_owned();
            let kind = entry.header().entry_type();
            match kind {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let size = entry.header().size().map_err(not_tar)?;
                    assets.check_size(size, max_bytes)?;
                    let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
                    entry.read_to_end(&mut data).map_err(not_tar)?;
                    assets.add(&path, Some(Bytes::from(data)))?;
                }
                tar::EntryType::Directory => assets.add(&path, None)?,
                // Extended headers describe the next entry; the tar reader applies them.
                tar::EntryType::XHeader | tar::EntryType::XGlobalHeader => {}
                other => {
                    let kind = match other {
                        tar::EntryType::Symlink => "symlink".to_string(),
                        tar::EntryType::Link => "hard link".to_string(),
                        other => format!("{other:?} entry").to_lowercase(),
                    };
                    return Err(AssetsError::NotRegular { path, kind });
                }
            }
        }
        if !assets
            .nodes
            .iter()
            .any(|n| !matches!(n.kind, NodeKind::Dir(_)))
        {
            return Err(AssetsError::Empty);
        }
        Ok(assets)
    }

    /// Reads a directory tree into memory.
    ///
    /// # Errors
    /// If it cannot be read, holds a symlink or special file, or is too large.
    pub fn from_dir(dir: &Path, max_bytes: u64) -> Result<Self, AssetsError> {
        let mut assets = Self::empty();
        let mut pending = vec![(dir.to_path_buf(), String::new())];
        let io = |p: &Path| {
            let path = p.display().to_string();
            move |source| AssetsError::Io { path, source }
        };
        while let Some((host, rel)) = pending.pop() {
            for entry in std::fs::read_dir(&host).map_err(io(&host))? {
                let entry = entry.map_err(io(&host))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let rel = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                let path = entry.path();
                let meta = std::fs::symlink_metadata(&path).map_err(io(&path))?;
                if meta.is_dir() {
                    assets.add(&rel, None)?;
                    pending.push((path, rel));
                } else if meta.is_file() {
                    assets.check_size(meta.len(), max_bytes)?;
                    let data = std::fs::read(&path).map_err(io(&path))?;
                    assets.add(&rel, Some(Bytes::from(data)))?;
                } else {
                    let kind = if meta.is_symlink() {
                        "symlink"
                    } else {
                        "special file"
                    };
                    return Err(AssetsError::NotRegular {
                        path: rel,
                        kind: kind.into(),
                    });
                }
            }
        }
        Ok(assets)
    }

    fn check_size(&self, more: u64, max_bytes: u64) -> Result<(), AssetsError> {
        if self.bytes.saturating_add(more) > max_bytes {
            return Err(AssetsError::TooLarge(format!(
                "files total more than {max_bytes} bytes"
            )));
        }
        Ok(())
    }

    /// Adds a file (`Some(data)`) or directory (`None`) at `path`, creating its parents.
    fn add(&mut self, path: &str, data: Option<Bytes>) -> Result<(), AssetsError> {
        let bad = |reason| AssetsError::BadPath {
            path: path.to_string(),
            reason,
        };
        if path.starts_with('/') {
            return Err(bad("absolute paths are not allowed"));
        }
        if path.len() > MAX_PATH || path.contains('\0') {
            return Err(bad("path is too long or has a NUL byte"));
        }
        let parts: Vec<&str> = path
            .split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .collect();
        if parts.contains(&"..") {
            return Err(bad("`..` is not allowed"));
        }
        let Some((last, dirs)) = parts.split_last() else {
            return match data {
                None => Ok(()), // `./` itself
                Some(_) => Err(bad("a file needs a name")),
            };
        };
        let mut dir = 0;
        let mut at = String::new();
        for d in dirs {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(d);
            dir = self.child(dir, d, &at, None)?;
        }
        let full = parts.join("/");
        let is_file = data.is_some();
        let node = self.child(dir, last, &full, data)?;
        match (&self.nodes[node].kind, is_file) {
            (NodeKind::Dir(_), true) => Err(bad("a directory of this name exists")),
            _ => Ok(()),
        }
    }

    /// The entry `name` of directory `dir`, created (as a directory, or a file with `data`)
    /// if missing.
    fn child(
        &mut self,
        dir: usize,
        name: &str,
        full: &str,
        data: Option<Bytes>,
    ) -> Result<usize, AssetsError> {
        if let Some(&i) = self.index.get(full) {
            return match (&mut self.nodes[i].kind, data) {
                (NodeKind::Dir(_), None) => Ok(i),
                (NodeKind::File(old), Some(new)) => {
                    // A later entry of the same name replaces the earlier one, as `tar x` does.
                    self.bytes = self.bytes - old.len() as u64 + new.len() as u64;
                    *old = new;
                    Ok(i)
                }
                _ => Err(AssetsError::BadPath {
                    path: full.to_string(),
                    reason: "is both a file and a directory",
                }),
            };
        }
        if self.nodes.len() > MAX_ENTRIES {
            return Err(AssetsError::TooLarge(format!(
                "more than {MAX_ENTRIES} files and directories"
            )));
        }
        let i = self.nodes.len();
        let kind = match data {
            Some(d) => {
                self.bytes += d.len() as u64;
                NodeKind::File(d)
            }
            None => NodeKind::Dir(Vec::new()),
        };
        self.nodes.push(Node {
            name: name.to_string(),
            parent: dir,
            kind,
        });
        self.index.insert(full.to_string(), i);
        let names: Vec<String> = match &self.nodes[dir].kind {
            NodeKind::Dir(children) => children
                .iter()
                .map(|&c| self.nodes[c].name.clone())
                .collect(),
            NodeKind::File(_) => {
                return Err(AssetsError::BadPath {
                    path: full.to_string(),
                    reason: "its parent is a file",
                });
            }
        };
        let at = names.partition_point(|n| n.as_str() < name);
        if let NodeKind::Dir(children) = &mut self.nodes[dir].kind {
            children.insert(at, i);
        }
        Ok(i)
    }

    /// Resolves a guest path relative to directory node `base`. `.` and `..` are resolved
    /// lexically and may not climb above the root; absolute paths are refused.
    ///
    /// # Errors
    /// The [`Lookup`] failure.
    pub fn resolve(&self, base: usize, path: &str) -> Result<usize, Lookup> {
        if path.starts_with('/') {
            return Err(Lookup::Escape);
        }
        let mut at = base;
        for c in path.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    if at == 0 {
                        return Err(Lookup::Escape);
                    }
                    at = self.nodes[at].parent;
                }
                name => {
                    let NodeKind::Dir(children) = &self.nodes[at].kind else {
                        return Err(Lookup::NotDir);
                    };
                    at = children
                        .binary_search_by(|&i| self.nodes[i].name.as_str().cmp(name))
                        .map(|k| children[k])
                        .map_err(|_| Lookup::NotFound)?;
                }
            }
        }
        // `file.txt/` names a directory.
        if path.ends_with('/') && matches!(self.nodes[at].kind, NodeKind::File(_)) {
            return Err(Lookup::NotDir);
        }
        Ok(at)
    }

    /// The node with this index.
    pub fn node(&self, i: usize) -> &Node {
        &self.nodes[i]
    }

    /// Files and directories (not counting the root).
    pub fn entries(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Total bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            // `set_path` refuses `..`; write the raw name to test what a hostile archive holds.
            let name = &mut h.as_old_mut().name;
            name[..path.len()].copy_from_slice(path.as_bytes());
            if *kind == tar::EntryType::Symlink {
                h.set_link_name("/etc/passwd").unwrap();
            }
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn tar_archives_become_a_tree() {
        use tar::EntryType::{Directory, Regular};
        let a = Assets::from_tar(
            &tar_of(&[
                ("./", Directory, b""),
                ("./index.html", Regular, b"<h1>hi</h1>"),
                ("css/site.css", Regular, b"body{}"),
            ]),
            1 << 20,
        )
        .unwrap();
        assert_eq!((a.entries(), a.bytes()), (3, 17));
        let css = a.resolve(0, "css/./site.css").unwrap();
        assert!(matches!(&a.node(css).kind, NodeKind::File(d) if &d[..] == b"body{}"));
        let dir = a.resolve(0, "css").unwrap();
        assert_eq!(a.resolve(dir, "../index.html"), a.resolve(0, "index.html"));
        assert_eq!(a.resolve(0, "css/../../x"), Err(Lookup::Escape));
        assert_eq!(a.resolve(0, "/etc/passwd"), Err(Lookup::Escape));
        assert_eq!(a.resolve(0, "index.html/x"), Err(Lookup::NotDir));
        assert_eq!(a.resolve(0, "nope"), Err(Lookup::NotFound));
    }

    #[test]
    fn hostile_archives_are_refused() {
        use tar::EntryType::{Regular, Symlink};
        for (entries, want) in [
            (vec![("../x", Regular, &b"x"[..])], "`..`"),
            (vec![("/etc/x", Regular, &b"x"[..])], "absolute"),
            (vec![("link", Symlink, &b""[..])], "symlink"),
        ] {
            let e = Assets::from_tar(&tar_of(&entries), 1 << 20).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        }
        let big = Assets::from_tar(&tar_of(&[("a", Regular, &[0u8; 100])]), 10).unwrap_err();
        assert!(matches!(big, AssetsError::TooLarge(_)), "{big}");
        assert!(matches!(
            Assets::from_tar(b"not a tar archive at all", 10),
            Err(AssetsError::NotTar(_))
        ));
    }

    #[test]
    fn directories_are_read_without_following_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("sub/a.txt"), b"a").unwrap();
        let a = Assets::from_dir(dir.path(), 1 << 20).unwrap();
        assert!(a.resolve(0, "sub/a.txt").is_ok());
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("p")).unwrap();
        let e = Assets::from_dir(dir.path(), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
    }
}
