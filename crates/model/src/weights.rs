//! Memory-mapped safetensors checkpoints: a single `model.safetensors` or the shards listed by
//! `model.safetensors.index.json`. Tensors are converted to `f32` on request; the CPU backend
//! computes in `f32` whatever the storage dtype.

use crate::error::{ModelError, Result};
use memmap2::Mmap;
use routed_backend::cpu::{Matrix, MatrixData, streamed_vec};
use safetensors::{Dtype, SafeTensors};
use std::{
    collections::HashMap,
    fs::File,
    path::{Path, PathBuf},
};

struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte range within the shard's mmap (header included in the offset).
    range: std::ops::Range<usize>,
}

struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// The tensors of a checkpoint, by name.
pub struct Weights {
    dir: PathBuf,
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
}

impl Weights {
    /// Opens the checkpoint in `dir`.
    pub fn open(dir: &Path) -> Result<Self> {
        let index = dir.join("model.safetensors.index.json");
        let files = if index.exists() {
            shard_files(&index)?
        } else {
            let single = dir.join("model.safetensors");
            if !single.exists() {
                return Err(ModelError::Io {
                    path: single,
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "no model.safetensors or index",
                    ),
                });
            }
            vec!["model.safetensors".to_owned()]
        };
        let mut weights = Self { dir: dir.to_owned(), shards: Vec::new(), entries: HashMap::new() };
        for file in files {
            weights.add_shard(dir.join(file))?;
        }
        Ok(weights)
    }

    fn add_shard(&mut self, path: PathBuf) -> Result<()> {
        let file =
            File::open(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        // SAFETY: the checkpoint is treated as read-only for the life of the engine.
        let mmap = unsafe { Mmap::map(&file) }
            .map_err(|source| ModelError::Io { path: path.clone(), source })?;
        let bad = |message: String| ModelError::Safetensors { path: path.clone(), message };
        let (header_len, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|e| bad(e.to_string()))?;
        let data_start = 8 + header_len;
        let shard = self.shards.len();
        for (name, info) in metadata.tensors() {
            let (begin, end) = info.data_offsets;
            if data_start + end > mmap.len() {
                return Err(bad(format!("tensor {name:?} extends past the end of the file")));
            }
            let entry = Entry {
                shard,
                dtype: info.dtype,
                shape: info.shape.clone(),
                range: data_start + begin..data_start + end,
            };
            self.entries.insert(name, entry);
        }
        self.shards.push(Shard { path, mmap });
        Ok(())
    }

    /// Whether a tensor exists.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the checkpoint has no tensors.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The stored shape of a tensor.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    /// Bytes `name` occupies in its shard, if it exists.
    pub fn num_bytes(&self, name: &str) -> Option<usize> {
        self.entries.get(name).map(|e| e.range.len())
    }

    /// Loads `name` as a weight matrix `[product of all but the last dim, last dim]`, checking
    /// that its shape is `shape`. bf16 tensors stay bf16 (the kernels widen them exactly); other
    /// dtypes become `f32`.
    pub fn matrix(&self, name: &str, shape: &[usize]) -> Result<Matrix> {
        self.matrix_slice(name, shape, 0..shape[0])
    }

    /// Like [`Self::matrix`], reading only the entries `leading` of the first dimension (e.g. some
    /// experts of a fused `[experts, rows, cols]` tensor). Only those bytes are read from the
    /// mapping.
    pub fn matrix_slice(
        &self,
        name: &str,
        shape: &[usize],
        leading: std::ops::Range<usize>,
    ) -> Result<Matrix> {
        let cols = *shape.last().expect("a matrix has at least one dimension");
        let (bytes, dtype) = self.slice_bytes(name, shape, leading.clone())?;
        let count = leading.len() * shape[1..].iter().product::<usize>();
        let rows = count / cols.max(1);
        if dtype == Dtype::BF16 {
            let mut values = streamed_vec(count);
            values.extend(bytes.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]])));
            return Ok(Matrix::new(rows, cols, MatrixData::Bf16(values)));
        }
        let values = self.convert_f32(name, bytes, dtype, count)?;
        Ok(Matrix::from_f32(rows, cols, values))
    }

    /// Loads `name` as `f32`, checking that its shape is `shape`.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let (bytes, dtype) =
            self.slice_bytes(name, shape, 0..shape.first().copied().unwrap_or(1))?;
        let count: usize = shape.iter().product();
        self.convert_f32(name, bytes, dtype, count)
    }

    /// The bytes of entries `leading` of the first dimension of `name`, checking that its shape
    /// is `shape`.
    fn slice_bytes(
        &self,
        name: &str,
        shape: &[usize],
        leading: std::ops::Range<usize>,
    ) -> Result<(&[u8], Dtype)> {
        let entry = self.entry(name)?;
        let path = &self.shards[entry.shard].path;
        if entry.shape != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_owned(),
                path: path.clone(),
                expected: shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        let bytes = &self.shards[entry.shard].mmap[entry.range.clone()];
        let count: usize = shape.iter().product();
        let bad = |message: String| ModelError::Safetensors { path: path.clone(), message };
        if bytes.len() * 8 != count * entry.dtype.bitsize() {
            return Err(bad(format!(
                "tensor {name:?}: byte length {} does not match its shape {shape:?}",
                bytes.len()
            )));
        }
        let num_leading = shape.first().copied().unwrap_or(1);
        if leading.start > leading.end || leading.end > num_leading {
            return Err(ModelError::BadInput(format!(
                "entries {leading:?} of tensor {name:?} with shape {shape:?}"
            )));
        }
        let stride = bytes.len().checked_div(num_leading).unwrap_or(0);
        Ok((&bytes[leading.start * stride..leading.end * stride], entry.dtype))
    }

    /// `count` values of `dtype` in `bytes`, as `f32`.
    fn convert_f32(
        &self,
        name: &str,
        bytes: &[u8],
        dtype: Dtype,
        count: usize,
    ) -> Result<Vec<f32>> {
        let entry = self.entry(name)?;
        let path = &self.shards[entry.shard].path;
        let out = match dtype {
            Dtype::F32 => convert::<f32>(bytes, count, |v| v),
            Dtype::BF16 => convert::<half::bf16>(bytes, count, half::bf16::to_f32),
            Dtype::F16 => convert::<half::f16>(bytes, count, half::f16::to_f32),
            other => {
                return Err(ModelError::UnsupportedDtype {
                    name: name.to_owned(),
                    path: path.clone(),
                    dtype: format!("{other:?}"),
                });
            }
        };
        out.ok_or_else(|| ModelError::Safetensors {
            path: path.clone(),
            message: format!("tensor {name:?}: {} bytes hold no {count} values", bytes.len()),
        })
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.entries.get(name).ok_or_else(|| ModelError::MissingTensor {
            name: name.to_owned(),
            dir: self.dir.clone(),
        })
    }
}

/// Reinterprets little-endian bytes as `count` values of `T` (copying when the mmap offset is not
/// aligned for `T`) and converts each to `f32`.
fn convert<T: bytemuck::Pod>(bytes: &[u8], count: usize, f: impl Fn(T) -> f32) -> Option<Vec<f32>> {
    if bytes.len() != count * size_of::<T>() {
        return None;
    }
    Some(match bytemuck::try_cast_slice::<u8, T>(bytes) {
        Ok(values) => values.iter().map(|&v| f(v)).collect(),
        Err(_) => {
            bytes.chunks_exact(size_of::<T>()).map(|c| f(bytemuck::pod_read_unaligned(c))).collect()
        }
    })
}

fn shard_files(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index)
        .map_err(|source| ModelError::Io { path: index.to_owned(), source })?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|source| ModelError::Json { path: index.to_owned(), source })?;
    let map = value.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| {
        ModelError::Config { path: index.to_owned(), message: "missing `weight_map` object".into() }
    })?;
    let mut files: Vec<String> =
        map.values().filter_map(|v| v.as_str().map(str::to_owned)).collect();
    files.sort();
    files.dedup();
    Ok(files)
}
