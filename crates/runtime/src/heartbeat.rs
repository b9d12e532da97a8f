//! The idle heartbeat actor: while the engine is idle it sends a dummy forward to every runner at
//! a fixed interval (expert-parallel collectives need every rank to step). A dummy forward uses
//! the scratch block and scratch state only, so it never resets or evicts anything.

use crate::{
    messages::{DummyForward, DummyForwardDone, SetIdle},
    runner::RunnerActor,
    scheduler::SchedulerActor,
};
use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, SpawnHandle, WrapFuture};
use std::time::Duration;

/// Sends dummy forwards while idle.
pub struct HeartbeatActor {
    period: Duration,
    runners: Vec<Addr<RunnerActor>>,
    scheduler: Option<Addr<SchedulerActor>>,
    timer: Option<SpawnHandle>,
    in_flight: usize,
}

impl HeartbeatActor {
    /// A heartbeat every `period` to `runners`.
    pub fn new(period: Duration, runners: Vec<Addr<RunnerActor>>) -> Self {
        Self { period, runners, scheduler: None, timer: None, in_flight: 0 }
    }

    /// Where to report executed dummy forwards.
    pub fn set_scheduler(&mut self, scheduler: Addr<SchedulerActor>) {
        self.scheduler = Some(scheduler);
    }

    fn beat(&mut self, ctx: &mut Context<Self>) {
        // Never queue a beat behind one that has not run yet.
        if self.in_flight > 0 {
            return;
        }
        for runner in &self.runners {
            self.in_flight += 1;
            let done = runner.send(DummyForward).into_actor(self).map(|result, act, _| {
                act.in_flight -= 1;
                match result {
                    Ok(Ok(())) => {
                        if let Some(s) = &act.scheduler {
                            s.do_send(DummyForwardDone);
                        }
                    }
                    Ok(Err(e)) => tracing::warn!("dummy forward failed: {e}"),
                    Err(_) => tracing::warn!("dummy forward not delivered: the runner is gone"),
                }
            });
            ctx.spawn(done);
        }
    }
}

impl Actor for HeartbeatActor {
    type Context = Context<Self>;
}

/// Lets the engine hand the heartbeat its scheduler once both exist.
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct Connect(pub Addr<SchedulerActor>);

impl Handler<Connect> for HeartbeatActor {
    type Result = ();

    fn handle(&mut self, msg: Connect, _: &mut Context<Self>) {
        self.set_scheduler(msg.0);
    }
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
