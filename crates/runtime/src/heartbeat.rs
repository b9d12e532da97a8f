//! The idle heartbeat actor: while the engine is idle it asks the executor for a dummy forward at
//! a fixed interval. Every rank takes part in each one as a lockstep unit, which keeps the ranks'
//! collectives aligned (expert parallelism needs every rank to step). A dummy forward uses the
//! scratch block and scratch state only, so it never resets or evicts anything.

use crate::executor::{ExecutorActor, ExecutorError, RunDummyForward};
use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, Message, Recipient, SpawnHandle,
    WrapFuture,
};
use std::time::Duration;

/// Heartbeat -> whoever counts beats (the scheduler): a dummy forward ran on every rank. No reply.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DummyForwardDone;

/// Scheduler -> heartbeat: the engine became idle (`true`: nothing running or waiting) or busy.
/// No reply.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetIdle(pub bool);

/// Sends dummy forwards while idle.
pub struct HeartbeatActor {
    period: Duration,
    executor: Addr<ExecutorActor>,
    report: Recipient<DummyForwardDone>,
    timer: Option<SpawnHandle>,
    in_flight: bool,
}

impl HeartbeatActor {
    /// A heartbeat every `period` through `executor`, reporting each beat that ran to `report`.
    pub fn new(
        period: Duration,
        executor: Addr<ExecutorActor>,
        report: Recipient<DummyForwardDone>,
    ) -> Self {
        Self { period, executor, report, timer: None, in_flight: false }
    }

    fn beat(&mut self, ctx: &mut Context<Self>) {
        // Never queue a beat behind one that has not run yet.
        if self.in_flight {
            return;
        }
        self.in_flight = true;
        let done = self.executor.send(RunDummyForward).into_actor(self).map(|result, act, _| {
            act.in_flight = false;
            match result {
                Ok(Ok(())) => act.report.do_send(DummyForwardDone),
                // Released between the scheduler's word and this beat: nothing to keep warm.
                Ok(Err(e @ ExecutorError::Released(_))) => tracing::debug!("no dummy forward: {e}"),
                Ok(Err(e)) => tracing::warn!("dummy forward failed: {e}"),
                Err(_) => tracing::warn!("dummy forward not delivered: the executor is gone"),
            }
        });
        ctx.spawn(done);
    }
}

impl Actor for HeartbeatActor {
    type Context = Context<Self>;
}

impl Handler<SetIdle> for HeartbeatActor {
    type Result = ();

    fn handle(&mut self, msg: SetIdle, ctx: &mut Context<Self>) {
        match (msg.0, self.timer.take()) {
            (true, None) if !self.period.is_zero() => {
                self.timer = Some(ctx.run_interval(self.period, |act, ctx| act.beat(ctx)));
            }
            (true, Some(t)) => self.timer = Some(t),
            (false, Some(t)) => {
                ctx.cancel_future(t);
            }
            _ => {}
        }
    }
}
