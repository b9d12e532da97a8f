//! Building the actor system ([`Engine::start`]); [`EngineHandle`] talks to it.

use crate::{
    EngineConfig, EngineError, EngineHandle, MatmulPrecision, ModelInfo, WeightsInfo,
    cache_manager::CacheManagerActor,
    copy_worker::CopyWorkerHandle,
    executor::ExecutorActor,
    heartbeat::HeartbeatActor,
    outbox::Outbox,
    routing_cache::RoutingCacheActor,
    routing_ring::SlotRing,
    runner::{RoutingSink, RunnerActor},
    scheduler::{Peers, SchedulerActor},
    timings::Timings,
    worker::{CacheShape, CpuWorker, CudaLimits, CudaWorker, Worker},
};
use actix::{Actor, Addr, AsyncContext, SyncArbiter};
use routed_backend::{
    Device, DeviceSpec,
    collective::{Collective, InProcessGroup},
    cuda::CudaDevice,
};
use routed_cache::{CacheConfig, KvCacheManager, MambaCacheConfig};
use routed_model::{Model, Tokenizer};
use routed_routing::{RoutingStore, RoutingStoreConfig};
use routed_scheduler::{Scheduler, SchedulerConfig, json_mode::JsonVocabulary};
use routed_types::BlockId;
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

/// Most KV blocks an engine sizes itself to from a memory budget.
const MAX_AUTO_BLOCKS: usize = 1 << 16;
/// Host slots of rank 0's routing ring: steps whose rows can be on their way to the host at once.
const NUM_ROUTING_SLOTS: usize = 3;

/// Starts engines.
pub struct Engine;

impl Engine {
    /// Loads the model and starts the actors.
    pub fn start(config: EngineConfig) -> Result<EngineHandle, EngineError> {
        Self::start_with_progress(config, &mut |_, _| {})
    }

    /// Like [`Engine::start`], reporting weight-loading progress as `(tensors, total)` (rank 0's,
    /// when several ranks load).
    pub fn start_with_progress(
        config: EngineConfig,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<EngineHandle, EngineError> {
        if config.expert_parallel_size == 0 {
            return Err(EngineError::Load("the expert parallel size must be at least 1".into()));
        }
        let Ranks { workers, collectives: ranks } = match config.device {
            DeviceSpec::Cpu => load_cpu_workers(&config, progress)?,
            _ => load_cuda_workers(&config, progress)?,
        };
        let dir = config.model.dir().to_owned();
        let tokenizer =
            Arc::new(Tokenizer::from_dir(&dir).map_err(|e| EngineError::Load(e.to_string()))?);
        let parts = Parts::new(&config, workers, ranks, tokenizer)?;
        let info = parts.info.clone();
        let tokenizer = parts.tokenizer.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("routed-engine".into())
            .spawn(move || {
                let system = actix::System::new();
                system.block_on(async move {
                    let _ = tx.send(parts.spawn());
                });
                system.run().ok();
            })
            .map_err(|e| EngineError::Load(format!("cannot spawn the engine thread: {e}")))?;
        let scheduler = rx
            .recv()
            .map_err(|_| EngineError::Load("the engine thread died while starting".into()))??;
        Ok(EngineHandle::new(scheduler, info, tokenizer))
    }
}

/// The ranks of an expert-parallel group: their workers and their collective handles (kept for
/// the timings).
struct Ranks {
    workers: Vec<Box<dyn Worker>>,
    collectives: Vec<Arc<dyn Collective>>,
}

/// One CPU worker per rank of the expert-parallel group, each on its share of the threads. The
/// ranks load side by side; rank 0 reports progress.
fn load_cpu_workers(
    config: &EngineConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Ranks, EngineError> {
    let num_ranks = config.expert_parallel_size;
    let threads = config
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let per_rank = (threads / num_ranks).max(1);
    let dir = config.model.dir();
    let ranks = InProcessGroup::ranks(num_ranks);
    let models = load_side_by_side(ranks.clone(), progress, |c, p| Model::load_rank(dir, c, p));
    let workers = models
        .into_iter()
        .map(|model| {
            let mut model = model.map_err(|e| EngineError::Load(e.to_string()))?;
            model.set_matmul_precision(config.matmul_precision);
            let worker = CpuWorker::new(Arc::new(model), per_rank)
                .map_err(|e| EngineError::Load(e.to_string()))?;
            Ok(Box::new(worker) as Box<dyn Worker>)
        })
        .collect::<Result<_, EngineError>>()?;
    Ok(Ranks { workers, collectives: ranks })
}

/// One CUDA worker per rank of the expert-parallel group, rank r on the r-th device from the
/// configured one (`DeviceSpec::for_rank`): each rank's part of the model is loaded on the host
/// by the checkpoint loader, uploaded, and the host copy dropped. The ranks load side by side;
/// rank 0 reports progress.
fn load_cuda_workers(
    config: &EngineConfig,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Ranks, EngineError> {
    let num_ranks = config.expert_parallel_size;
    let devices = open_cuda_devices(config)?;
    if num_ranks > 1 && config.peer_exchange {
        let linked = CudaDevice::link_peers(&devices).map_err(|e| {
            EngineError::Load(format!("linking the {num_ranks} ranks' devices: {e}"))
        })?;
        if linked {
            tracing::info!(num_ranks, "expert rows travel between the devices (peer access)");
        } else {
            tracing::info!(
                num_ranks,
                "expert rows travel through host memory: some pair of devices has no peer access"
            );
        }
    }
    if config.matmul_precision == MatmulPrecision::Bf16
        && let Some(rank) = devices.iter().position(|d| !d.has_bf16_mma())
    {
        return Err(EngineError::Load(format!(
            "--matmul-precision bf16 runs on bf16 tensor cores (sm_80 and later); {} is {}",
            config.device.for_rank(rank),
            devices[rank].arch()
        )));
    }
    let dir = config.model.dir();
    let ranks = InProcessGroup::ranks(num_ranks);
    let load = |(dev, ranks), progress: &mut dyn FnMut(usize, usize)| {
        let mut model = Model::load_rank(dir, ranks, progress).map_err(|e| e.to_string())?;
        model.set_matmul_precision(config.matmul_precision);
        let limits = CudaLimits {
            max_tokens_per_step: config.max_num_batched_tokens.max(1),
            max_num_seqs: config.max_num_seqs.max(1),
            num_snapshot_slots: if model.config().is_hybrid() {
                config.mamba_snapshot_slots
            } else {
                0
            },
            max_model_len: config.max_model_len.unwrap_or(model.config().max_position_embeddings),
            cuda_graphs: config.cuda_graphs,
            device_sampling: config.device_sampling,
        };
        let worker = CudaWorker::new(dev, &model, limits).map_err(|e| e.to_string())?;
        Ok::<_, String>(Box::new(worker) as Box<dyn Worker>)
    };
    let inputs = devices.into_iter().zip(ranks.iter().cloned()).collect();
    let workers = load_side_by_side(inputs, progress, load);
    let workers = workers.into_iter().collect::<Result<_, _>>().map_err(EngineError::Load)?;
    Ok(Ranks { workers, collectives: ranks })
}

/// Every rank's device, before anything loads (a missing GPU fails first, naming its rank). The
/// simulator's ranks share their queues, as GPUs of one machine can wait on each other.
fn open_cuda_devices(config: &EngineConfig) -> Result<Vec<CudaDevice>, EngineError> {
    let num_ranks = config.expert_parallel_size;
    let mut devices: Vec<CudaDevice> = Vec::with_capacity(num_ranks);
    for rank in 0..num_ranks {
        let spec = config.device.for_rank(rank);
        let opened = match (spec, devices.last()) {
            (DeviceSpec::CudaSim, Some(previous)) => previous.simulated_peer(),
            _ => Device::open(spec).map(|d| match d {
                Device::Cuda(dev) => dev,
                Device::Cpu => unreachable!("a CUDA spec opens a CUDA device"),
            }),
        };
        devices.push(opened.map_err(|e| match num_ranks {
            1 => EngineError::device(&e, e.to_string()),
            _ => EngineError::device(&e, format!("rank {rank} of {num_ranks} on {spec}: {e}")),
        })?);
    }
    Ok(devices)
}

/// Runs `load` for every rank's input at once: rank 0 on this thread, reporting `progress`, the
/// others on threads of their own. The results come back in rank order.
fn load_side_by_side<I: Send, T: Send>(
    inputs: Vec<I>,
    progress: &mut dyn FnMut(usize, usize),
    load: impl Fn(I, &mut dyn FnMut(usize, usize)) -> T + Sync,
) -> Vec<T> {
    let mut inputs = inputs.into_iter();
    let first = inputs.next().expect("at least one rank");
    let load = &load;
    std::thread::scope(|s| {
        let others: Vec<_> = inputs.map(|i| s.spawn(move || load(i, &mut |_, _| {}))).collect();
        let first = load(first, progress);
        std::iter::once(first)
            .chain(others.into_iter().map(|h| h.join().expect("a loading thread panicked")))
            .collect()
    })
}

/// How many KV blocks the engine uses, and why.
struct PoolSize {
    /// Blocks a sequence can hold (the scratch block excluded).
    num_usable: usize,
    /// The routing cap holds fewer blocks' rows than the KV memory would allow.
    sized_by_routing_cap: bool,
}

impl PoolSize {
    /// The configured (or memory-budgeted) pool, cut down to what `--routing-cache-max-bytes`
    /// holds rows for when routing is captured: a block without rows can never give a prefix hit
    /// and a running request's rows must all be kept, so blocks past the cap would only turn
    /// into refused rows. Cached blocks' rows then go when the cache manager evicts the blocks,
    /// least recently used first, and matching stops in the same step.
    fn choose(
        config: &EngineConfig,
        workers: &[Box<dyn Worker>],
        meta: &routed_types::RoutingMeta,
        is_moe: bool,
    ) -> Result<Self, EngineError> {
        let block_size = config.block_size.max(1);
        let num_usable = config.num_kv_blocks.unwrap_or_else(|| {
            let per_block = workers[0].kv_block_bytes(block_size);
            let budget = (config.kv_cache_memory_gb * 1e9) as usize;
            let free = workers.iter().filter_map(|w| w.kv_memory_limit(block_size));
            auto_blocks(budget, per_block, free)
        });
        let cap =
            config.routing_cache_max_bytes.filter(|_| config.enable_routing_capture && is_moe);
        let Some(max_bytes) = cap else {
            return Ok(Self { num_usable, sized_by_routing_cap: false });
        };
        let per_block = RoutingStoreConfig::new(meta, 1, block_size).block_bytes();
        let fits = max_bytes / per_block.max(1);
        if fits == 0 {
            return Err(EngineError::Load(format!(
                "--routing-cache-max-bytes {max_bytes} holds no block's routing rows: one block of \
                 {block_size} tokens needs {per_block} bytes"
            )));
        }
        if fits >= num_usable {
            return Ok(Self { num_usable, sized_by_routing_cap: false });
        }
        tracing::warn!(
            "--routing-cache-max-bytes {max_bytes} holds the routing rows of {fits} KV blocks \
             ({per_block} bytes each): the KV pool uses {fits} of its {num_usable} blocks"
        );
        Ok(Self { num_usable: fits, sized_by_routing_cap: true })
    }

    /// The longest prompt + output: as configured (else the model's), but never more than the
    /// pool holds, or every request that leaves `max_tokens` to fill the context would be refused.
    fn max_model_len(&self, config: &EngineConfig, model_max: usize, block_size: usize) -> usize {
        let wanted = config.max_model_len.unwrap_or(model_max);
        let capacity = self.num_usable * block_size;
        if wanted > capacity {
            tracing::warn!(
                "max_model_len {wanted} is more than the KV pool's {capacity} token slots: using \
                 {capacity}"
            );
        }
        wanted.min(capacity)
    }
}

/// The KV blocks `budget` bytes buy at `per_block` bytes each, and on devices no more than the
/// fullest one's `free` memory (each rank's limit) holds: every rank keeps the same blocks.
fn auto_blocks(budget: usize, per_block: usize, free: impl Iterator<Item = usize>) -> usize {
    let bytes = free.min().map_or(budget, |free| budget.min(free));
    (bytes / per_block.max(1)).clamp(16, MAX_AUTO_BLOCKS)
}

/// Everything the actors are built from, prepared outside the actor system so errors return
/// synchronously from `start`.
struct Parts {
    config: EngineConfig,
    workers: Vec<Box<dyn Worker>>,
    ranks: Vec<Arc<dyn Collective>>,
    tokenizer: Arc<Tokenizer>,
    info: Arc<ModelInfo>,
    cache: KvCacheManager,
    routing: RoutingStore,
    scheduler: SchedulerConfig,
}

impl Parts {
    fn new(
        config: &EngineConfig,
        mut workers: Vec<Box<dyn Worker>>,
        ranks: Vec<Arc<dyn Collective>>,
        tokenizer: Arc<Tokenizer>,
    ) -> Result<Self, EngineError> {
        let load = |e: String| EngineError::Load(e);
        let first = &workers[0];
        let mc = first.config().clone();
        let block_size = config.block_size.max(1);
        let meta = first.routing_meta();
        let routing_meta = meta.clone().unwrap_or(routed_types::RoutingMeta {
            num_layers: 1,
            moe_layer_ids: vec![0],
            num_experts: 1,
            top_k: 1,
        });
        let pool = PoolSize::choose(config, &workers, &routing_meta, meta.is_some())?;
        let num_usable = pool.num_usable;
        // One extra block is the scratch block that dummy forwards write to.
        let num_blocks = num_usable + 1;
        let hybrid = mc.is_hybrid();
        let snapshot_slots = if hybrid { config.mamba_snapshot_slots } else { 0 };
        let cache_config = CacheConfig {
            block_size,
            num_blocks,
            num_scratch_blocks: 1,
            enable_prefix_caching: config.enable_prefix_caching,
            hash_generated_positions: mc.math_depends_on_position_kind(),
            defer_pending_siblings: true,
            mamba: hybrid.then_some(MambaCacheConfig { num_snapshot_slots: snapshot_slots }),
        };
        let cache = KvCacheManager::new(cache_config).map_err(|e| load(e.to_string()))?;
        let mut store_config = RoutingStoreConfig::new(&routing_meta, num_blocks, block_size);
        if let Some(max) = config.routing_cache_max_bytes {
            store_config = store_config.with_max_bytes(max);
        }
        let routing = RoutingStore::new(store_config).map_err(|e| load(e.to_string()))?;
        let max_model_len = pool.max_model_len(config, mc.max_position_embeddings, block_size);
        let info = Arc::new(ModelInfo {
            served_model_name: config.served_model_name.clone(),
            checkpoint_dir: config.model.dir().to_owned(),
            max_model_len,
            vocab_size: mc.vocab_size,
            routing: meta,
            routing_capture: config.enable_routing_capture,
            num_kv_blocks: num_usable,
            kv_pool_sized_by_routing_cap: pool.sized_by_routing_cap,
            block_size,
            num_snapshot_slots: snapshot_slots,
            max_waiting_requests: config.max_waiting_requests,
            max_num_seqs: config.max_num_seqs,
            max_num_batched_tokens: config.max_num_batched_tokens,
            prefix_caching: config.enable_prefix_caching,
            device: first.device(),
            expert_parallel_size: workers.len(),
            default_seed: config.seed,
            weight_bytes_per_token: first.weight_bytes_per_token(),
        });
        let shape = CacheShape {
            num_blocks,
            block_size,
            num_live_states: config.max_num_seqs,
            num_snapshot_slots: snapshot_slots,
            scratch_block: BlockId(num_usable as u32),
            max_tokens_per_step: config.max_num_batched_tokens.max(1),
            max_model_len,
            num_routing_slots: NUM_ROUTING_SLOTS,
        };
        for worker in &mut workers {
            worker.initialize_cache(&shape).map_err(|e| load(e.to_string()))?;
        }
        Ok(Self {
            scheduler: SchedulerConfig {
                max_num_batched_tokens: config.max_num_batched_tokens.max(1),
                max_num_seqs: config.max_num_seqs.max(1),
                max_waiting_requests: config.max_waiting_requests,
                max_model_len,
                hybrid,
                eos_token_ids: tokenizer.eos_token_ids().to_vec(),
                capture_routing: config.enable_routing_capture,
            },
            config: config.clone(),
            workers,
            ranks,
            tokenizer,
            info,
            cache,
            routing,
        })
    }

    /// Starts every actor; must run inside the engine's actix system.
    fn spawn(self) -> Result<Addr<SchedulerActor>, EngineError> {
        let timings = Arc::new(Timings::default());
        let cache = CacheManagerActor::new(self.cache).start();
        let routing = RoutingCacheActor::new(self.routing, cache.clone(), timings.clone()).start();
        let (copy, _thread) = CopyWorkerHandle::spawn(routing.clone(), timings.clone())
            .map_err(|e| EngineError::Load(format!("cannot start the copy worker: {e}")))?;
        let outbox = Outbox::start()
            .map_err(|e| EngineError::Load(format!("cannot start the delivery thread: {e}")))?;
        let ranks = self
            .workers
            .into_iter()
            .map(|worker| {
                let sink = match (worker.rank(), worker.routing_engine()) {
                    (0, Some(engine)) => {
                        Some(RoutingSink { ring: SlotRing::new(engine), copy: copy.clone() })
                    }
                    _ => None,
                };
                // The factory runs once per thread, and the arbiter has one: the worker moves in.
                let slot = Mutex::new(Some((worker, sink)));
                let timings = timings.clone();
                SyncArbiter::start(1, move || {
                    let taken = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
                    let (worker, sink) = match taken {
                        Some((w, sink)) => (Some(w), sink),
                        None => (None, None),
                    };
                    RunnerActor::new(worker, sink, timings.clone())
                })
            })
            .collect();
        let executor = ExecutorActor::new(ranks).start();
        // The vocabulary as bytes, for outputs constrained to JSON (`response_format`).
        let vocabulary =
            JsonVocabulary::new(&self.tokenizer.token_bytes(), self.tokenizer.eos_token_ids());
        let policy = Scheduler::new(self.scheduler).with_json_vocabulary(Arc::new(vocabulary));
        let (tokenizer, info) = (self.tokenizer, self.info);
        let heartbeat_ms = self.config.heartbeat_ms;
        let ranks = self.ranks;
        let weights = WeightsInfo {
            dir: self.config.model.dir().to_owned(),
            version: self.config.weight_version.clone(),
            num_updates: 0,
        };
        Ok(SchedulerActor::create(move |ctx| {
            let heartbeat = (heartbeat_ms > 0).then(|| {
                let period = Duration::from_millis(heartbeat_ms);
                HeartbeatActor::new(period, executor.clone(), ctx.address().recipient()).start()
            });
            let peers = Peers { cache, executor, routing, heartbeat, timings, ranks, outbox };
            SchedulerActor::new(policy, tokenizer, info, peers, weights)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn automatic_pools_fit_the_fullest_device() {
        let mib = 1 << 20;
        // The CPU: the budget alone.
        assert_eq!(auto_blocks(100 * mib, mib, std::iter::empty()), 100);
        // Devices: the rank with the least free memory decides, below the budget.
        assert_eq!(auto_blocks(100 * mib, mib, [80 * mib, 30 * mib, 60 * mib].into_iter()), 30);
        assert_eq!(auto_blocks(20 * mib, mib, [80 * mib, 30 * mib].into_iter()), 20);
        // Never fewer than 16 blocks, never more than the cap.
        assert_eq!(auto_blocks(100 * mib, mib, [mib].into_iter()), 16);
        assert_eq!(auto_blocks(usize::MAX, 1, std::iter::empty()), MAX_AUTO_BLOCKS);
    }
}
