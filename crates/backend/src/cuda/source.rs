//! The kernel sources embedded in the binary and the closed table of kernels.
//!
//! Each compilation unit is the shared prelude, the unit's helper parts and its `.cu` file,
//! concatenated in that order (the sources include nothing, so NVRTC needs no include path). A unit
//! becomes one CUBIN and one loaded module; [`KernelId`] names every `extern "C" __global__`
//! function of every unit, and a test checks the table against the sources in both directions.

/// Reads a file of the top-level `kernels/` folder into the binary.
macro_rules! kernel_file {
    ($path:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/", $path))
    };
}

/// Definitions every unit starts with: bf16 casts, the CPU's reduction tree and `exp`.
const PRELUDE: &str = kernel_file!("common/prelude.cuh");
/// The product tile shared by the dense and the MoE matrix products.
const DOT_TILE: &str = kernel_file!("gemm/dot_tile.cuh");
const MMA_TILE: &str = kernel_file!("gemm/mma_tile.cuh");
/// Row norms staged through shared memory, shared by the norms and Mamba2's gated norm.
const ROW_NORM: &str = kernel_file!("common/row_norm.cuh");
const EXPERT_COMMON: &str = kernel_file!("moe/expert_common.cuh");
/// The step's sequences as the Mamba kernels see them.
const SSM_SEQS: &str = kernel_file!("ssm/seqs.cuh");

/// One NVRTC compilation unit: a `.cu` file of `kernels/` with the parts it is compiled after.
#[derive(Debug)]
pub struct KernelUnit {
    /// Path under `kernels/`, also the program name NVRTC reports errors under.
    pub path: &'static str,
    /// Helper parts compiled between the prelude and the file, in order.
    parts: &'static [&'static str],
    /// The file itself.
    body: &'static str,
}

impl KernelUnit {
    /// The full source NVRTC compiles: prelude, parts, body.
    pub fn source(&self) -> String {
        let mut src = String::from(PRELUDE);
        for part in self.parts.iter().chain([&self.body]) {
            src.push('\n');
            src.push_str(part);
        }
        src
    }

    /// The kernels this unit defines.
    pub fn kernels(&'static self) -> impl Iterator<Item = KernelId> {
        KernelId::ALL.iter().copied().filter(move |k| std::ptr::eq(k.unit(), self))
    }
}

macro_rules! units {
    ($($name:ident = $path:literal [$($part:ident),*];)*) => {
        $(
            #[doc = concat!("The unit `kernels/", $path, "`.")]
            pub static $name: KernelUnit =
                KernelUnit { path: $path, parts: &[$($part),*], body: kernel_file!($path) };
        )*
        /// Every compilation unit.
        pub static UNITS: &[&KernelUnit] = &[$(&$name),*];
    };
}

units! {
    EMBED = "common/embed.cu" [];
    NORM = "common/norm.cu" [ROW_NORM];
    ACTIVATION = "common/activation.cu" [];
    GEMM = "gemm/gemm.cu" [DOT_TILE];
    GEMM_MMA = "gemm/gemm_mma.cu" [MMA_TILE];
    ATTENTION = "attention/paged_attention.cu" [];
    QKV_HEADS = "attention/qkv_heads.cu" [];
    STATE_COPY = "cache/state_copy.cu" [];
    ROUTER = "moe/router.cu" [];
    ALIGN = "moe/align.cu" [];
    EXPERTS = "moe/experts.cu" [DOT_TILE, EXPERT_COMMON];
    EXPERTS_MMA = "moe/experts_mma.cu" [MMA_TILE, EXPERT_COMMON];
    COMBINE = "moe/combine.cu" [];
    CONV1D = "ssm/conv1d.cu" [SSM_SEQS];
    SCAN = "ssm/scan.cu" [SSM_SEQS];
    GATED_NORM = "ssm/gated_norm.cu" [ROW_NORM];
    SAMPLE = "sample/sample.cu" [];
}

macro_rules! kernel_ids {
    ($($variant:ident = $name:literal in $unit:ident;)*) => {
        /// Every kernel, by the symbol it has in its unit. The launch wrapper of a kernel is the
        /// one place that knows its argument order.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum KernelId {
            $(
                #[doc = concat!("The kernel `", $name, "`.")]
                $variant,
            )*
        }

        impl KernelId {
            /// Every kernel, in table order.
            pub const ALL: &'static [KernelId] = &[$(KernelId::$variant),*];

            /// The `extern "C"` symbol.
            pub fn name(self) -> &'static str {
                match self { $(KernelId::$variant => $name,)* }
            }

            /// The unit that defines it.
            pub fn unit(self) -> &'static KernelUnit {
                match self { $(KernelId::$variant => &$unit,)* }
            }

            /// Position in [`KernelId::ALL`], for tables indexed by kernel.
            pub fn index(self) -> usize {
                self as usize
            }
        }
    };
}

kernel_ids! {
    EmbedGather = "embed_gather_bf16" in EMBED;
    EmbedGatherF32 = "embed_gather_f32" in EMBED;
    RmsNorm = "rms_norm_f32" in NORM;
    AddRmsNorm = "add_rms_norm_f32" in NORM;
    SiluMul = "silu_mul_f32" in ACTIVATION;
    Relu2 = "relu2_f32" in ACTIVATION;
    Scale = "scale_f32" in ACTIVATION;
    GemmBf16 = "gemm_bf16w_f32" in GEMM;
    GemmF32 = "gemm_f32w_f32" in GEMM;
    GemmBf16Row = "gemm_bf16w_f32_row" in GEMM;
    GemmF32Row = "gemm_f32w_f32_row" in GEMM;
    GemmBf16Staged = "gemm_bf16w_f32_staged" in GEMM;
    GemmF32Staged = "gemm_f32w_f32_staged" in GEMM;
    GemmBf16Mma = "gemm_bf16w_mma" in GEMM_MMA;
    GemmBf16MmaStaged = "gemm_bf16w_mma_staged" in GEMM_MMA;
    GemmBf16MmaStagedWide = "gemm_bf16w_mma_staged_wide" in GEMM_MMA;
    PagedAttention = "paged_attention_bf16kv" in ATTENTION;
    AttentionCombine = "attention_combine_f32" in ATTENTION;
    QkvHeads = "qkv_heads_f32" in QKV_HEADS;
    StateCopy = "state_copy_f32" in STATE_COPY;
    MoeRouter = "moe_router_topk" in ROUTER;
    MoeSortPairs = "moe_sort_pairs" in ALIGN;
    MoeExpertUp = "moe_expert_up" in EXPERTS;
    MoeExpertUpF32 = "moe_expert_up_f32w" in EXPERTS;
    MoeExpertDown = "moe_expert_down" in EXPERTS;
    MoeExpertDownF32 = "moe_expert_down_f32w" in EXPERTS;
    MoeExpertUpRow = "moe_expert_up_row" in EXPERTS;
    MoeExpertUpRowF32 = "moe_expert_up_row_f32w" in EXPERTS;
    MoeExpertDownRow = "moe_expert_down_row" in EXPERTS;
    MoeExpertDownRowF32 = "moe_expert_down_row_f32w" in EXPERTS;
    MoeExpertUpMma = "moe_expert_up_mma" in EXPERTS_MMA;
    MoeExpertDownMma = "moe_expert_down_mma" in EXPERTS_MMA;
    MoeCombine = "moe_combine" in COMBINE;
    MoeGatherPeerRows = "moe_gather_peer_rows" in COMBINE;
    MambaConv1d = "mamba_conv1d" in CONV1D;
    MambaScan = "mamba_scan" in SCAN;
    MambaGatedNorm = "mamba_gated_norm" in GATED_NORM;
    Argmax = "argmax_f32" in SAMPLE;
    LogSoftmax = "log_softmax_f32" in SAMPLE;
    Sample = "sample_f32" in SAMPLE;
    LogitEdits = "logit_edits_f32" in SAMPLE;
    GatherLogprob = "gather_logprob_f32" in SAMPLE;
    TopLogprobs = "top_logprobs_f32" in SAMPLE;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every `extern "C" __global__` symbol defined in `text`.
    fn global_names(text: &str) -> Vec<String> {
        let mut names = Vec::new();
        let mut rest = text;
        let marker = "extern \"C\" __global__";
        while let Some(at) = rest.find(marker) {
            rest = rest[at + marker.len()..].trim_start();
            rest = rest.strip_prefix("void").expect("kernels return void").trim_start();
            // The name is the first word followed by its parameters; attributes before it either
            // take their own (`__launch_bounds__(...)`) or are macros standing for one.
            loop {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .expect("a kernel name ends");
                let (word, after) = (&rest[..end], rest[end..].trim_start());
                rest = match after.strip_prefix('(') {
                    Some(_) if word.starts_with("__") => {
                        let close = after.find(')').expect("an attribute's arguments close");
                        after[close + 1..].trim_start()
                    }
                    Some(_) => {
                        names.push(word.to_owned());
                        break;
                    }
                    None => after,
                };
            }
        }
        names
    }

    fn kernel_files() -> Vec<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let mut files = Vec::new();
        let mut dirs = vec![root];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("kernels/ is readable") {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        files.sort();
        files
    }

    #[test]
    fn every_kernel_in_the_sources_has_exactly_one_table_entry_and_back() {
        let mut in_sources = BTreeSet::new();
        for file in kernel_files() {
            let text = std::fs::read_to_string(&file).expect("a kernel source is text");
            for name in global_names(&text) {
                assert!(in_sources.insert(name.clone()), "{name} is defined twice");
            }
        }
        let in_table: BTreeSet<String> =
            KernelId::ALL.iter().map(|k| k.name().to_owned()).collect();
        assert_eq!(in_table.len(), KernelId::ALL.len(), "a kernel name is in the table twice");
        assert_eq!(in_sources, in_table, "kernels/ and KernelId disagree");
    }

    #[test]
    fn every_kernel_is_defined_in_the_unit_the_table_names() {
        for &k in KernelId::ALL {
            assert!(
                global_names(k.unit().body).iter().any(|n| n == k.name()),
                "{} is not in {}",
                k.name(),
                k.unit().path
            );
            assert_eq!(KernelId::ALL[k.index()], k);
        }
    }

    #[test]
    fn every_source_file_is_compiled_and_none_includes_a_header() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let bodies: Vec<&str> = UNITS.iter().map(|u| u.body).collect();
        for file in kernel_files() {
            let text = std::fs::read_to_string(&file).expect("a kernel source is text");
            let rel = file.strip_prefix(&root).expect("under kernels/").to_string_lossy();
            for line in text.lines() {
                assert!(
                    !line.trim_start().starts_with("#include"),
                    "{rel} includes a header ({line}); kernels are header-free"
                );
            }
            let used = bodies.contains(&text.as_str())
                || [PRELUDE, DOT_TILE, MMA_TILE, ROW_NORM, EXPERT_COMMON, SSM_SEQS]
                    .contains(&text.as_str());
            assert!(used, "{rel} is in kernels/ but no unit compiles it");
        }
        for unit in UNITS {
            assert!(unit.kernels().next().is_some(), "{} defines no kernel", unit.path);
        }
    }
}
