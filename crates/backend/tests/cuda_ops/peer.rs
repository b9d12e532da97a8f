//! Expert parallelism over GPUs that read each other's memory: the gather of the other ranks'
//! expert rows, and the order the peer group's signals put between the ranks' streams.

use super::support::*;
use routed_backend::cuda::{
    CudaDevice,
    ops::ExpertShard,
    peer::{PeerLink, PeerPhase},
};

/// Every rank's run of the sorted rows comes from that rank's buffer, bit for bit; this rank's
/// own run and the rows past the step's stay as they were. The ranks' buffers share one device
/// here, which the kernel cannot tell from peers' memory.
#[test]
fn gather_copies_the_other_ranks_runs_bit_for_bit() {
    let Some(dev) = gpu_or_skip("gather_copies_the_other_ranks_runs_bit_for_bit") else { return };
    let (world, num_local, hidden, num_pairs) = (4, 4, 40, 41);
    let num_experts = world * num_local;
    // A row per pair; the starts of 16 experts: rank 2's experts have no rows, rank 3 one expert
    // of 8 (one row is left past the runs).
    let rows = num_pairs;
    let counts = [4, 8, 0, 4, 4, 0, 4, 8, 0, 0, 0, 0, 0, 8, 0, 0];
    let mut starts = vec![0i32];
    for c in counts {
        starts.push(starts.last().unwrap() + c);
    }
    let end = *starts.last().unwrap() as usize;
    assert!(end <= rows);
    let run = |q: usize| starts[q * num_local] as usize..starts[(q + 1) * num_local] as usize;
    let mut rng = Rng::new(31);
    let buffers: Vec<Vec<f32>> = (0..world).map(|_| rng.vec(rows * hidden, -1.0, 1.0)).collect();
    let mut p = Plan::new(dev);
    let spans: Vec<_> = buffers.iter().map(|b| p.input(b)).collect();
    let (table, expert_starts) = (p.output::<u64>(world), p.input(&starts));
    let mut m = p.alloc();
    let addrs: Vec<u64> = spans.iter().map(|&s| m.get(s).addr()).collect();
    m.write(table, &addrs);
    for rank in 0..world {
        let shard = ExpertShard { num_experts, first: rank * num_local, num_local };
        let out = m.get(spans[rank]);
        dev.moe_gather_peer_rows(
            out,
            m.get(table),
            m.get(expert_starts),
            (num_pairs, shard),
            (rank, world),
            hidden,
        )
        .unwrap();
        let got = m.read(spans[rank]);
        let mut want = buffers[rank].clone();
        for q in (0..world).filter(|&q| q != rank) {
            let r = run(q);
            want[r.start * hidden..r.end * hidden]
                .copy_from_slice(&buffers[q][r.start * hidden..r.end * hidden]);
        }
        assert_bits(&format!("rank {rank}"), &got, &want);
        // Every rank now holds every run: the buffers agree on the step's rows.
        m.write(spans[rank], &buffers[rank]);
    }
    let shard = ExpertShard { num_experts, first: 0, num_local: 3 };
    let err = dev
        .moe_gather_peer_rows(
            m.get(spans[0]),
            m.get(table),
            m.get(expert_starts),
            (num_pairs, shard),
            (0, world),
            hidden,
        )
        .unwrap_err();
    assert!(err.to_string().contains("3 of 16"), "{err}");
}

/// Two simulated devices sharing queues, like two GPUs of one machine.
fn linked_pair() -> Option<(&'static CudaDevice, &'static CudaDevice)> {
    let first = match CudaDevice::simulated() {
        Ok(d) => d,
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("no simulator: {e}"),
        Err(e) => {
            eprintln!("skipping the peer group's tests: no simulator ({e})");
            return None;
        }
    };
    let second = first.simulated_peer().unwrap();
    let devices = [first, second];
    assert!(CudaDevice::link_peers(&devices).unwrap(), "simulators sharing queues link");
    let [a, b] = devices.map(|d| &*Box::leak(Box::new(d)));
    Some((a, b))
}

/// Rank 1 reads rank 0's rows only after rank 0's kernel wrote them, and rank 0 writes them again
/// only after rank 1 read them: the simulator runs queued work as late as the streams allow, so a
/// missing wait reads the rows unwritten (rank 1's stream run first) or overwritten (rank 0's).
#[test]
fn a_peer_reads_rows_between_their_writes() {
    let Some((dev0, dev1)) = linked_pair() else { return };
    let (link0, link1): (&PeerLink, &PeerLink) =
        (dev0.peer_link().unwrap(), dev1.peer_link().unwrap());
    assert_eq!((link0.rank(), link1.rank(), link1.world_size()), (0, 1, 2));
    for rank1_first in [false, true] {
        let (num_local, hidden, num_pairs) = (1, 8, 8);
        let rows = num_pairs;
        // Expert 0 (rank 0) has rows 0..4, expert 1 (rank 1) rows 4..8.
        let starts = [0i32, 4, 8];
        let (mut p0, mut p1) = (Plan::new(dev0), Plan::new(dev1));
        let (rows0, rows1) =
            (p0.input(&vec![1.0f32; rows * hidden]), p1.input(&vec![0.0f32; rows * hidden]));
        let (table, starts1) = (p1.output::<u64>(2), p1.input(&starts));
        let (m0, mut m1) = (p0.alloc(), p1.alloc());
        link0.publish(m0.get(rows0));
        link1.publish(m1.get(rows1));
        let mut addrs = Vec::new();
        link1.buffers(rows * hidden, &mut addrs).unwrap();
        m1.write(table, &addrs);

        // Layer 1: rank 0 doubles its rows; rank 1 copies them once they are written.
        let (s0, s1) = (dev0.compute_stream(), dev1.compute_stream());
        dev0.scale(m0.get(rows0), 2.0, rows * hidden).unwrap();
        link0.signal(PeerPhase::Written, s0).unwrap();
        link1.wait_for_others(PeerPhase::Written, s1).unwrap();
        let shard = ExpertShard { num_experts: 2, first: 1, num_local };
        dev1.moe_gather_peer_rows(
            m1.get(rows1),
            m1.get(table),
            m1.get(starts1),
            (num_pairs, shard),
            (1, 2),
            hidden,
        )
        .unwrap();
        link1.signal(PeerPhase::Read, s1).unwrap();
        // Layer 2: rank 0 writes its rows again once rank 1 has read them.
        link0.wait_for_others(PeerPhase::Read, s0).unwrap();
        dev0.scale(m0.get(rows0), 2.0, rows * hidden).unwrap();
        let (got0, got1) = match rank1_first {
            false => (m0.read(rows0), m1.read(rows1)),
            true => {
                let got1 = m1.read(rows1);
                (m0.read(rows0), got1)
            }
        };
        let what = format!("rank 1's stream run first: {rank1_first}");
        assert!(got0.iter().all(|&v| v == 4.0), "{what}: rank 0 wrote twice");
        assert!(got1[..4 * hidden].iter().all(|&v| v == 2.0), "{what}: layer 1's rows {got1:?}");
        assert!(got1[4 * hidden..].iter().all(|&v| v == 0.0), "{what}: its own run stays");
    }
}

#[test]
fn only_devices_that_can_wait_on_each_other_link() {
    let (Ok(a), Ok(b)) = (CudaDevice::simulated(), CudaDevice::simulated()) else {
        eprintln!("skipping only_devices_that_can_wait_on_each_other_link: no simulator");
        return;
    };
    assert!(!CudaDevice::link_peers(std::slice::from_ref(&a)).unwrap(), "one device");
    assert!(!CudaDevice::link_peers(&[a.clone(), b]).unwrap(), "separate simulators");
    assert!(a.peer_link().is_none());
    let devices = [a.clone(), a.simulated_peer().unwrap()];
    assert!(CudaDevice::link_peers(&devices).unwrap());
    assert!(CudaDevice::link_peers(&devices).is_err(), "a device joins one group");
}
