//! The `.npy` and raw int32 encodings, byte for byte, and read back by numpy.

use std::path::{Path, PathBuf};
use std::process::Command;

use routed_routing::IdWidth;
use routed_routing::{RoutingError, encode_npy, encode_raw_i32, npy_header};
use routed_types::RoutingRows;

fn rows(shape: [usize; 3], ids: Vec<u16>) -> RoutingRows {
    RoutingRows { start: 0, num_rows: shape[0], num_moe_layers: shape[1], top_k: shape[2], ids }
}

/// A header as numpy writes it: dict, spaces, newline, total padded to 128 bytes.
fn hand_header(dict: &str, header_len: u8) -> Vec<u8> {
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&[header_len, 0]);
    out.extend_from_slice(dict.as_bytes());
    out.extend_from_slice(&[b' '; 55]);
    out.push(b'\n');
    out
}

#[test]
fn npy_u8_matches_hand_checked_bytes() {
    let r = rows([2, 1, 2], vec![0, 7, 255, 3]);
    let got = encode_npy(&r, 256).expect("fits");
    // 10 preamble bytes + 62 dict bytes + 55 spaces + newline = 128; header_len 118 = 0x76.
    let mut expected =
        hand_header("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 1, 2), }", 0x76);
    assert_eq!(expected.len(), 128);
    expected.extend_from_slice(&[0x00, 0x07, 0xff, 0x03]);
    assert_eq!(got, expected);
}

#[test]
fn npy_u16_matches_hand_checked_bytes() {
    let r = rows([1, 2, 1], vec![256, 300]);
    let got = encode_npy(&r, 301).expect("fits");
    let mut expected =
        hand_header("{'descr': '<u2', 'fortran_order': False, 'shape': (1, 2, 1), }", 0x76);
    // 256 = 0x0100 and 300 = 0x012c, little-endian.
    expected.extend_from_slice(&[0x00, 0x01, 0x2c, 0x01]);
    assert_eq!(got, expected);
}

#[test]
fn npy_header_aligns_data_to_64_bytes() {
    let shapes =
        [[0, 1, 1], [1, 48, 8], [32_767, 48, 8], [123_456_789, 1000, 22], [usize::MAX, 9, 9]];
    for width in [IdWidth::U8, IdWidth::U16] {
        for shape in shapes {
            let h = npy_header(width, shape);
            assert_eq!(h.len() % 64, 0, "{shape:?}");
            assert_eq!(usize::from(u16::from_le_bytes([h[8], h[9]])), h.len() - 10);
            assert_eq!(h.last(), Some(&b'\n'));
            let text = std::str::from_utf8(&h[10..]).expect("ascii");
            let dims = format!("({}, {}, {})", shape[0], shape[1], shape[2]);
            assert!(text.contains(&dims) && text.contains(width.npy_descr()), "{text}");
        }
    }
}

#[test]
fn encoders_reject_inconsistent_rows_and_ids_out_of_range() {
    let short = rows([2, 1, 2], vec![1, 2, 3]);
    assert!(matches!(encode_npy(&short, 8), Err(RoutingError::RowsShape { len: 3, .. })));
    assert!(matches!(encode_raw_i32(&short), Err(RoutingError::RowsShape { .. })));
    let r = rows([1, 1, 2], vec![1, 8]);
    let err = encode_npy(&r, 8).unwrap_err();
    assert_eq!(err, RoutingError::IdOutOfRange { index: 1, id: 8, num_experts: 8 });
}

#[test]
fn raw_i32_matches_hand_checked_bytes() {
    let r = rows([2, 1, 2], vec![0, 1, 300, 65_535]);
    let got = encode_raw_i32(&r).expect("consistent");
    let expected: [u8; 16] = [
        0x00, 0x00, 0x00, 0x00, // 0
        0x01, 0x00, 0x00, 0x00, // 1
        0x2c, 0x01, 0x00, 0x00, // 300
        0xff, 0xff, 0x00, 0x00, // 65535
    ];
    assert_eq!(got, expected);
    assert!(encode_raw_i32(&rows([0, 4, 2], vec![])).expect("empty").is_empty());
}

/// One array for numpy to check: where its files are and what they must hold.
struct Case {
    name: &'static str,
    shape: [usize; 3],
    num_experts: u32,
    ids: Vec<u16>,
}

fn cases() -> Vec<Case> {
    let pseudo = |n: usize, m: u32| (0..n).map(|i| ((i * 7919 + 13) % m as usize) as u16).collect();
    vec![
        Case { name: "u8", shape: [5, 3, 2], num_experts: 256, ids: pseudo(30, 256) },
        Case { name: "u16", shape: [4, 2, 3], num_experts: 300, ids: pseudo(24, 300) },
        Case { name: "u16_max", shape: [1, 1, 2], num_experts: 65_536, ids: vec![65_535, 0] },
        Case { name: "empty", shape: [0, 48, 8], num_experts: 128, ids: vec![] },
        Case { name: "qwen_like", shape: [40, 48, 8], num_experts: 128, ids: pseudo(15_360, 128) },
    ]
}

fn write_case(dir: &Path, case: &Case) -> String {
    let r = rows(case.shape, case.ids.clone());
    let npy = dir.join(format!("{}.npy", case.name));
    let raw = dir.join(format!("{}.i32", case.name));
    std::fs::write(&npy, encode_npy(&r, case.num_experts).expect("fits")).expect("write npy");
    std::fs::write(&raw, encode_raw_i32(&r).expect("consistent")).expect("write raw");
    let dtype = if case.num_experts <= 256 { "uint8" } else { "uint16" };
    let ids: Vec<String> = case.ids.iter().map(u16::to_string).collect();
    format!(
        "{{\"npy\": {:?}, \"raw\": {:?}, \"dtype\": \"{dtype}\", \"shape\": [{}, {}, {}], \"ids\": [{}]}}",
        npy.display().to_string(),
        raw.display().to_string(),
        case.shape[0],
        case.shape[1],
        case.shape[2],
        ids.join(", ")
    )
}

const CHECK_SCRIPT: &str = r#"
import io, json, sys
try:
    import numpy as np
except ImportError as e:
    print(f"numpy unavailable: {e}")
    sys.exit(3)
for spec in json.load(open(sys.argv[1])):
    data = open(spec["npy"], "rb").read()
    a = np.load(io.BytesIO(data), allow_pickle=False)
    shape = tuple(spec["shape"])
    assert a.dtype == np.dtype(spec["dtype"]), (spec["npy"], a.dtype)
    assert a.shape == shape, (spec["npy"], a.shape)
    assert a.flags.c_contiguous
    expected = np.array(spec["ids"], dtype=np.int64).reshape(shape)
    assert (a.astype(np.int64) == expected).all(), spec["npy"]
    raw = np.frombuffer(open(spec["raw"], "rb").read(), dtype="<i4").reshape(shape)
    assert (raw == expected).all(), spec["raw"]
    mine = io.BytesIO()
    np.save(mine, expected.astype(spec["dtype"]))
    assert mine.getvalue() == data, ("np.save writes different bytes", spec["npy"])
print("numpy agrees")
"#;

fn scratch_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routed-routing-npy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
fn numpy_reads_npy_and_raw_int32() {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let python = std::env::var("ROUTED_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let dir = scratch_dir();
    let specs: Vec<String> = cases().iter().map(|c| write_case(&dir, c)).collect();
    let spec_path = dir.join("cases.json");
    std::fs::write(&spec_path, format!("[{}]", specs.join(",\n"))).expect("write specs");
    let output = Command::new(&python).arg("-c").arg(CHECK_SCRIPT).arg(&spec_path).output();
    let _ = std::fs::remove_dir_all(&dir);
    let output = match output {
        Ok(output) => output,
        Err(err) if !in_ci => {
            eprintln!("SKIP numpy_reads_npy_and_raw_int32: cannot run {python}: {err}");
            return;
        }
        Err(err) => panic!("CI=true but {python} cannot run: {err}"),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(3) {
        assert!(!in_ci, "CI=true but {python} has no numpy: {stdout}");
        eprintln!("SKIP numpy_reads_npy_and_raw_int32: {python}: {}", stdout.trim());
        return;
    }
    assert!(output.status.success(), "numpy check failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("numpy agrees"), "{stdout}");
}
