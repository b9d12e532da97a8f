//! The Prometheus recorder behind `GET /metrics`.
//!
//! The engine records its figures through the `metrics` facade; this module installs the global
//! Prometheus recorder once per process (several servers in one process share it) and renders it
//! on request. With no HTTP listener of its own the exporter needs `run_upkeep` called
//! periodically to drain histogram buckets, so a small thread does that.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// How often the recorder's upkeep runs.
const UPKEEP_PERIOD: Duration = Duration::from_secs(5);

/// Bucket bounds of `routed_step_duration_seconds`, so it renders as a histogram.
const STEP_BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

static RECORDER: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Installs the global Prometheus recorder, once per process; later calls return the same
/// handle. Call it before starting the engine: metrics recorded before a recorder exists are
/// lost. Fails (every time) when another global recorder was installed first.
pub fn install_metrics_recorder() -> Result<&'static PrometheusHandle, String> {
    RECORDER
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Full("routed_step_duration_seconds".into()),
                    STEP_BUCKETS,
                )
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| format!("cannot install the Prometheus recorder: {e}"))?;
            let upkeep = handle.clone();
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(UPKEEP_PERIOD);
                        upkeep.run_upkeep();
                    }
                })
                .map_err(|e| format!("cannot start the metrics upkeep thread: {e}"))?;
            Ok(handle)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// The Prometheus text of every recorded metric.
pub(crate) fn render_metrics() -> String {
    match install_metrics_recorder() {
        Ok(handle) => handle.render(),
        Err(reason) => format!("# no metrics: {reason}\n"),
    }
}
