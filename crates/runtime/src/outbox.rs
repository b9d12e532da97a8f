//! The delivery thread: request events leave the scheduler's thread in one message per step.
//!
//! A send on a request's stream wakes the task reading it, and where that task's runtime has
//! parked its threads the wake is a system call. Made by the scheduler, one per running request,
//! those calls sat on the step's path between one step's output and the next step's start (at
//! batch 64 most of the scheduler's time around a step). The scheduler queues its events in an
//! [`Outbox`] instead and ships them in one message; the delivery thread sends them, in the
//! order they were queued, while the next step runs. The scheduler's answers to its callers
//! (a pause taking hold, a weight update done, memory released, the engine drained) go the same
//! way, so that an answer never overtakes the events streamed before it.
//!
//! A final output's text is decoded here too ([`Outbox::finish`]): decoding a whole output takes
//! 0.2 ms at 4k tokens, so rollouts that all reach `max_tokens` in the same step (64 of them: 14
//! ms) held up the next step on the scheduler's thread.

use crate::{FinalOutput, RequestEvent};
use crossbeam_channel::{Receiver, Sender};
use routed_model::Tokenizer;
use routed_types::{FinishReason, SamplingParams, StopMatch, TokenId};
use std::sync::Arc;
use tokio::sync::{mpsc::UnboundedSender, oneshot};

/// What the delivery thread sends.
enum Delivery {
    /// An event and the stream it is for.
    Event(UnboundedSender<RequestEvent>, RequestEvent),
    /// A final output whose text is still to be decoded, and its stream.
    Final(UnboundedSender<RequestEvent>, Box<FinalOutput>, FinalText),
    /// An answer to a caller, sent once the events queued before it are.
    Answer(Box<dyn FnOnce() + Send>),
}

/// The scheduler's side of the delivery thread: events queued in order, shipped by
/// [`Outbox::flush`]. Every stream's events keep their order, whatever was shipped when, since
/// one thread sends them all in the order they were queued.
pub struct Outbox {
    queued: Vec<Delivery>,
    to_thread: Sender<Vec<Delivery>>,
    /// Batches the thread has emptied, so that shipping one allocates nothing.
    spare: Receiver<Vec<Delivery>>,
}

impl Outbox {
    /// Starts the delivery thread. It ends once the outbox is dropped and everything shipped is
    /// sent; a stream's sender held by a queued event is dropped only after that event is sent, so
    /// a stream never closes ahead of its events.
    pub fn start() -> std::io::Result<Self> {
        let (to_thread, batches) = crossbeam_channel::unbounded::<Vec<Delivery>>();
        let (give_back, spare) = crossbeam_channel::unbounded();
        std::thread::Builder::new().name("routed-deliver".into()).spawn(move || {
            for mut batch in batches {
                deliver(&mut batch);
                // The outbox may be gone already: the batch is then simply dropped.
                let _ = give_back.send(batch);
            }
        })?;
        Ok(Self { queued: Vec::new(), to_thread, spare })
    }

    /// Queues `event` for `stream`, behind everything queued before it. Whether anyone still reads
    /// the stream is `stream.is_closed()`, known at once.
    pub fn push(&mut self, stream: &UnboundedSender<RequestEvent>, event: RequestEvent) {
        self.queued.push(Delivery::Event(stream.clone(), event));
    }

    /// [`Outbox::push`], then [`Outbox::flush`]: for events outside a step's stream of tokens.
    pub fn send(&mut self, stream: &UnboundedSender<RequestEvent>, event: RequestEvent) {
        self.push(stream, event);
        self.flush();
    }

    /// Sends `output` on `stream` with its text decoded as `text` says (on the delivery thread),
    /// behind everything queued before it, and ships it.
    pub fn finish(
        &mut self,
        stream: &UnboundedSender<RequestEvent>,
        output: Box<FinalOutput>,
        text: FinalText,
    ) {
        self.queued.push(Delivery::Final(stream.clone(), output, text));
        self.flush();
    }

    /// Sends `value` to a caller once every event queued before it is sent, and ships it.
    pub fn answer<T: Send + 'static>(&mut self, caller: oneshot::Sender<T>, value: T) {
        // A caller gone is nobody's concern.
        let send = move || drop(caller.send(value));
        self.queued.push(Delivery::Answer(Box::new(send)));
        self.flush();
    }

    /// Ships everything queued to the delivery thread, or, should the thread be gone, sends it
    /// here.
    pub fn flush(&mut self) {
        if self.queued.is_empty() {
            return;
        }
        let next = self.spare.try_recv().unwrap_or_default();
        let batch = std::mem::replace(&mut self.queued, next);
        if let Err(returned) = self.to_thread.send(batch) {
            deliver(&mut returned.into_inner());
        }
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Sends each event on its stream and each answer, in order, emptying `batch`.
fn deliver(batch: &mut Vec<Delivery>) {
    for delivery in batch.drain(..) {
        match delivery {
            // A reader gone is the scheduler's to notice (`is_closed`) and act on.
            Delivery::Event(stream, event) => drop(stream.send(event)),
            Delivery::Final(stream, mut output, text) => {
                output.text = text.decode(&output.token_ids);
                drop(stream.send(RequestEvent::Finished(output)));
            }
            Delivery::Answer(send) => send(),
        }
    }
}

/// How a finished continuation's text is made from its tokens: decoded as the request asks
/// (special tokens kept or not), cut at a matched stop string, and without the token that ended
/// it (EOS or a stop token) unless `include_stop_str_in_output`, as vLLM and SGLang leave it out.
pub struct FinalText {
    tokenizer: Arc<Tokenizer>,
    skip_special_tokens: bool,
    /// The last token is left out.
    trim_last: bool,
    /// Bytes kept: the text up to a matched stop string.
    text_len: Option<usize>,
}

impl FinalText {
    /// The text of a continuation sampled with `params` that ended for `reason`, cut at
    /// `text_len` bytes when a stop string matched there.
    pub fn new(
        tokenizer: &Arc<Tokenizer>,
        params: &SamplingParams,
        reason: &FinishReason,
        text_len: Option<usize>,
    ) -> Self {
        let on_token =
            matches!(reason, FinishReason::Stop { matched: None | Some(StopMatch::Token(_)) });
        Self {
            tokenizer: tokenizer.clone(),
            skip_special_tokens: params.skip_special_tokens,
            trim_last: on_token && !params.include_stop_str_in_output,
            text_len,
        }
    }

    /// The text of `output`'s tokens.
    pub fn decode(&self, output: &[TokenId]) -> String {
        let ids = match output.split_last() {
            Some((_, kept)) if self.trim_last => kept,
            _ => output,
        };
        let mut text =
            self.tokenizer.decode_with(ids, self.skip_special_tokens).unwrap_or_default();
        if let Some(len) = self.text_len {
            text.truncate(len);
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EngineError;
    use tokio::sync::mpsc;

    fn event(n: usize) -> RequestEvent {
        RequestEvent::Error(EngineError::Internal(n.to_string()))
    }

    fn text(event: RequestEvent) -> String {
        match event {
            RequestEvent::Error(e) => e.to_string(),
            other => panic!("unexpected {other:?}"),
        }
    }

    /// The events a stream holds now.
    fn ready(rx: &mut mpsc::UnboundedReceiver<RequestEvent>) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok()).map(text).collect()
    }

    /// Every event of a stream, until it closes.
    fn to_end(mut rx: mpsc::UnboundedReceiver<RequestEvent>) -> Vec<String> {
        std::iter::from_fn(|| rx.blocking_recv()).map(text).collect()
    }

    fn texts(ns: impl Iterator<Item = usize>) -> Vec<String> {
        ns.map(|n| EngineError::Internal(n.to_string()).to_string()).collect()
    }

    #[test]
    fn events_arrive_in_order_before_later_answers_and_streams_close_after_them() {
        let mut outbox = Outbox::start().unwrap();
        let (a, mut rx_a) = mpsc::unbounded_channel();
        let (b, mut rx_b) = mpsc::unbounded_channel();
        let (gone, rx_gone) = mpsc::unbounded_channel();
        drop(rx_gone);
        for n in 0..100 {
            outbox.push(&a, event(n));
            outbox.push(&b, event(1000 + n));
            // A reader that went away costs nothing and stops nobody.
            outbox.push(&gone, event(n));
            if n % 7 == 0 {
                outbox.flush();
            }
        }
        outbox.send(&a, event(100));
        let (caller, answered) = oneshot::channel();
        outbox.answer(caller, ());
        answered.blocking_recv().unwrap();
        // Everything queued before the answer was on the streams when it came.
        assert_eq!(ready(&mut rx_a), texts(0..=100));
        assert_eq!(ready(&mut rx_b), texts(1000..1100));
        // Queued, never flushed: dropping the outbox ships it. The scheduler's senders go first;
        // the queued clones keep the streams open until their events are sent.
        outbox.push(&b, event(1100));
        drop((a, b, gone));
        drop(outbox);
        assert_eq!(to_end(rx_a), texts(0..0));
        assert_eq!(to_end(rx_b), texts(1100..1101));
    }

    #[test]
    fn a_final_output_is_sent_with_its_text_decoded_as_the_request_asks() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/qwen3_moe/model");
        let tokenizer = Arc::new(Tokenizer::from_dir(std::path::Path::new(dir)).unwrap());
        let ids = tokenizer.encode("Hello world, and then STOP here").unwrap();
        let whole = tokenizer.decode(&ids).unwrap();
        let but_last = tokenizer.decode(&ids[..ids.len() - 1]).unwrap();
        let params = SamplingParams::greedy(8);
        let keep = SamplingParams { include_stop_str_in_output: true, ..params.clone() };
        let eos = FinishReason::Stop { matched: Some(StopMatch::Token(ids[ids.len() - 1])) };
        let stop = FinishReason::Stop { matched: Some(StopMatch::Text("STOP".into())) };
        let cut = whole.find(" STOP").unwrap();
        let cases = [
            (FinalText::new(&tokenizer, &params, &FinishReason::Length, None), whole.clone()),
            // The token that ended it is left out, unless the request keeps its stop.
            (FinalText::new(&tokenizer, &params, &eos, None), but_last),
            (FinalText::new(&tokenizer, &keep, &eos, None), whole.clone()),
            (FinalText::new(&tokenizer, &params, &stop, Some(cut)), whole[..cut].to_owned()),
        ];
        let mut outbox = Outbox::start().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        for (text, _) in cases.iter() {
            outbox.push(&tx, event(0));
            let output = FinalOutput {
                index: 0,
                token_ids: ids.clone(),
                text: String::new(),
                finish_reason: FinishReason::Length,
                num_prompt_tokens: 1,
                num_cached_tokens: 0,
                routing: None,
                prompt_logprobs: None,
                weight_version: String::new(),
                weight_versions: Vec::new(),
            };
            let text = FinalText { tokenizer: tokenizer.clone(), ..*text };
            outbox.finish(&tx, Box::new(output), text);
        }
        for (_, want) in cases {
            // Behind the event queued before it.
            assert!(matches!(rx.blocking_recv(), Some(RequestEvent::Error(_))));
            match rx.blocking_recv() {
                Some(RequestEvent::Finished(output)) => assert_eq!(output.text, want),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[test]
    fn shipping_reuses_the_threads_emptied_batches() {
        let mut outbox = Outbox::start().unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        outbox.send(&tx, event(0));
        assert!(rx.blocking_recv().is_some());
        // The emptied batch comes back with its capacity.
        let spare = outbox.spare.recv().unwrap();
        assert!(spare.is_empty() && spare.capacity() > 0);
    }
}
