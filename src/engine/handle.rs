//! [`Engine`]: the engine core on a thread of its own, driven through a channel.
//!
//! Async callers (rollout tasks on tokio) send commands and await replies on oneshot
//! channels; the engine thread applies commands between steps and keeps stepping while
//! any sequence has work, so a branch waiting for a tool is simply absent from the
//! batch while the others go on.

use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::oneshot;

use crate::kv::{PinId, SeqId};
use crate::model::{LoadedModel, Model, TokenId};

use super::core::{EngineConfig, EngineCore};
use super::counters::{EngineStats, SeqUsage};
use super::death::{panic_message, Death};
use super::error::EngineError;
use super::sampling::SampledToken;
use super::sequence::Generation;
use super::stop::GenParams;
use super::weight_version::WeightVersion;

type Reply<T> = oneshot::Sender<Result<T, EngineError>>;
type TokenSender = tokio::sync::mpsc::UnboundedSender<SampledToken>;

/// A generation whose tokens arrive as they are sampled ([`Engine::generate_streaming`]).
pub struct TokenStream {
    tokens: tokio::sync::mpsc::UnboundedReceiver<SampledToken>,
    done: oneshot::Receiver<Result<Generation, EngineError>>,
}

impl TokenStream {
    /// The next kept token; `None` once the generation has ended (then
    /// [`Self::finish`] says how).
    pub async fn next(&mut self) -> Option<SampledToken> {
        self.tokens.recv().await
    }

    /// The whole generation, as [`Engine::generate`] returns it (tokens not yet taken
    /// by [`Self::next`] are in it too: it holds all of them).
    pub async fn finish(self) -> Result<Generation, EngineError> {
        self.done.await.map_err(|_| EngineError::Stopped)?
    }
}

enum Command {
    Add(Vec<TokenId>, Reply<SeqId>),
    Fork(SeqId, Reply<SeqId>),
    Append(SeqId, Vec<TokenId>, Reply<()>),
    Generate(SeqId, GenParams, Reply<Generation>),
    GenerateStream(SeqId, GenParams, TokenSender, Reply<Generation>),
    Prefill(SeqId, Reply<()>),
    Free(SeqId, Reply<SeqUsage>),
    Pin(SeqId, Reply<PinId>),
    Unpin(PinId, Reply<()>),
    Tokens(SeqId, Reply<Vec<TokenId>>),
    SequenceTokens(SeqId, Reply<Vec<TokenId>>),
    Stats(Reply<EngineStats>),
    ClearPrefixCache(Reply<()>),
    WaitForKvRoom(usize, Reply<()>),
    LoadWeights(Arc<Model>, Option<WeightVersion>, Reply<WeightVersion>),
}

impl Command {
    /// Answers the command with `err` instead of applying it.
    fn fail(self, err: EngineError) {
        use Command::*;
        match self {
            Add(_, r) | Fork(_, r) => drop(r.send(Err(err))),
            Append(_, _, r) | Prefill(_, r) | Unpin(_, r) | ClearPrefixCache(r) => {
                drop(r.send(Err(err)))
            }
            WaitForKvRoom(_, r) => drop(r.send(Err(err))),
            Generate(_, _, r) | GenerateStream(_, _, _, r) => drop(r.send(Err(err))),
            Free(_, r) => drop(r.send(Err(err))),
            Pin(_, r) => drop(r.send(Err(err))),
            Tokens(_, r) | SequenceTokens(_, r) => drop(r.send(Err(err))),
            Stats(r) => drop(r.send(Err(err))),
            LoadWeights(_, _, r) => drop(r.send(Err(err))),
        }
    }
}

/// A handle to the engine thread. Cloning it is cheap; the thread stops when the last
/// handle is dropped.
#[derive(Clone)]
pub struct Engine {
    /// Commands to the engine thread, applied in the order sent.
    commands: mpsc::Sender<Command>,
    model: Arc<LoadedModel>,
    config: EngineConfig,
    death: Arc<Death>,
    _thread: Arc<JoinGuard>,
}

struct JoinGuard(Option<JoinHandle<()>>);

impl Drop for JoinGuard {
    fn drop(&mut self) {
        // The sender is dropped with the last handle before this guard, so the thread
        // sees a closed channel and exits; joining keeps its errors from being lost.
        if let Some(h) = self.0.take() {
            let _ = h.join();
        }
    }
}

impl Engine {
    /// Starts the engine thread.
    pub fn start(model: Arc<LoadedModel>, config: EngineConfig) -> Result<Self, EngineError> {
        let core = EngineCore::new(model.clone(), config)?;
        let (tx, rx) = mpsc::channel();
        let death = Arc::new(Death::default());
        let thread_death = death.clone();
        let thread = std::thread::Builder::new()
            .name("treegrpo-engine".into())
            .spawn(move || run(core, rx, &thread_death))
            .map_err(EngineError::Spawn)?;
        Ok(Engine {
            commands: tx,
            model,
            config,
            death,
            _thread: Arc::new(JoinGuard(Some(thread))),
        })
    }

    /// The message of the panic that killed the engine thread, if one did (then every
    /// call fails with [`EngineError::Died`]).
    pub fn died(&self) -> Option<&str> {
        self.death.message()
    }

    /// Resolves with the panic's message once the engine thread has died (never, for
    /// an engine that lives): a server waits on it to answer 503 and exit.
    pub async fn until_died(&self) -> String {
        self.death.wait().await
    }

    /// The model the engine started with: its tokenizer, chat template and config
    /// hold for the engine's whole life. Its weights are those of version 0 only;
    /// [`Self::load_weights`] changes what the engine serves.
    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// The limits the engine was started with (block size, KV budget, batch caps).
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .map_err(|_| EngineError::Stopped)?;
        rx.await.map_err(|_| EngineError::Stopped)?
    }

    /// Starts a sequence from a prompt (cached prefixes are reused).
    pub async fn add_sequence(&self, prompt: Vec<TokenId>) -> Result<SeqId, EngineError> {
        self.call(|r| Command::Add(prompt, r)).await
    }

    /// Forks `seq`: the child shares its computed prefix (no recomputation).
    pub async fn fork(&self, seq: SeqId) -> Result<SeqId, EngineError> {
        self.call(|r| Command::Fork(seq, r)).await
    }

    /// Appends tokens (an observation) to be prefilled with the next steps.
    pub async fn append(&self, seq: SeqId, tokens: Vec<TokenId>) -> Result<(), EngineError> {
        self.call(|r| Command::Append(seq, tokens, r)).await
    }

    /// Generates on `seq` until a stop condition; resolves when it is done.
    pub async fn generate(&self, seq: SeqId, params: GenParams) -> Result<Generation, EngineError> {
        self.call(|r| Command::Generate(seq, params, r)).await
    }

    /// [`Self::generate`], its tokens also delivered one by one as they are sampled.
    /// Dropping the stream does not stop the generation: free the sequence for that.
    pub fn generate_streaming(&self, seq: SeqId, params: GenParams) -> TokenStream {
        let (token_tx, tokens) = tokio::sync::mpsc::unbounded_channel();
        let (tx, done) = oneshot::channel();
        // A stopped engine drops the command and with it both senders: `next` then
        // ends and `finish` reports `Stopped`.
        let _ = self
            .commands
            .send(Command::GenerateStream(seq, params, token_tx, tx));
        TokenStream { tokens, done }
    }

    /// Computes `seq`'s pending tokens now; afterwards forks of it start generating
    /// without recomputing anything.
    pub async fn prefill(&self, seq: SeqId) -> Result<(), EngineError> {
        self.call(|r| Command::Prefill(seq, r)).await
    }

    /// Drops `seq` and returns what it cost over its life.
    pub async fn free(&self, seq: SeqId) -> Result<SeqUsage, EngineError> {
        self.call(|r| Command::Free(seq, r)).await
    }

    /// Frees `seq` without waiting for the engine (from a `Drop`, where nothing can
    /// be awaited: a server's request that its client abandoned). Errors, such as a
    /// sequence freed already, are ignored.
    pub fn release(&self, seq: SeqId) {
        let (tx, _) = oneshot::channel();
        let _ = self.commands.send(Command::Free(seq, tx));
    }

    /// Keeps the computed tokens of `seq` resident (never freed or evicted) until
    /// [`Self::unpin`], whatever happens to `seq`, so later branches can start from them.
    /// An error if `seq` is unknown.
    pub async fn pin(&self, seq: SeqId) -> Result<PinId, EngineError> {
        self.call(|r| Command::Pin(seq, r)).await
    }

    /// Releases a pin taken by [`Self::pin`]. An error if the pin is unknown.
    pub async fn unpin(&self, pin: PinId) -> Result<(), EngineError> {
        self.call(|r| Command::Unpin(pin, r)).await
    }

    /// The tokens of `seq` that are in the KV cache.
    pub async fn tokens(&self, seq: SeqId) -> Result<Vec<TokenId>, EngineError> {
        self.call(|r| Command::Tokens(seq, r)).await
    }

    /// Every token of `seq`, computed or pending (see [`EngineCore::sequence_tokens`]).
    pub async fn sequence_tokens(&self, seq: SeqId) -> Result<Vec<TokenId>, EngineError> {
        self.call(|r| Command::SequenceTokens(seq, r)).await
    }

    /// Serves `weights` from now on; resolves with the new weight version once they
    /// are in place. Generations and prefills already running finish on the old
    /// weights; commands sent after this one wait for the swap, so they run on the new
    /// ones. Cached prefixes are forgotten and live sequences recompute their KV on
    /// their next use (see [`super::weights`]). The weights must have the served
    /// model's shape; the tokenizer and chat template stay the served model's.
    pub async fn load_weights(&self, weights: Arc<Model>) -> Result<WeightVersion, EngineError> {
        self.call(|r| Command::LoadWeights(weights, None, r)).await
    }

    /// [`Self::load_weights`] from a file: a GGUF or an HF checkpoint directory (as
    /// `treegrpo train` writes them), read on a blocking thread and served at the
    /// precision the engine started with. Only its weights are taken; its shape must
    /// be the served model's (and under fast, its layers quantised: see
    /// [`EngineError::KvFormat`]).
    pub async fn load_weights_from(&self, path: &Path) -> Result<WeightVersion, EngineError> {
        self.load_weights_from_as(path, None).await
    }

    /// [`Self::load_weights_from`] naming the new version (above the served one), or
    /// the next one when `None`: replicas of one policy then report the same version.
    pub async fn load_weights_from_as(
        &self,
        path: &Path,
        version: Option<WeightVersion>,
    ) -> Result<WeightVersion, EngineError> {
        let path = path.to_path_buf();
        // Served at the engine's precision, as the weights it started with: a file
        // loads exact, and a fast engine's f16 KV pool refuses exact weights.
        let precision = self.model.model.precision();
        let loaded = tokio::task::spawn_blocking(move || {
            LoadedModel::load(&path).and_then(|m| m.with_precision(precision))
        })
        .await
        .map_err(|source| EngineError::Task {
            task: "weight loading",
            source,
        })??;
        self.call(|r| Command::LoadWeights(loaded.model, version, r))
            .await
    }

    /// [`Self::load_weights`] naming the new version (above the served one).
    pub async fn load_weights_as(
        &self,
        weights: Arc<Model>,
        version: WeightVersion,
    ) -> Result<WeightVersion, EngineError> {
        self.call(|r| Command::LoadWeights(weights, Some(version), r))
            .await
    }

    /// A snapshot of the engine's counters, KV occupancy and step latencies. An error
    /// only if the engine has stopped.
    pub async fn stats(&self) -> Result<EngineStats, EngineError> {
        self.call(Command::Stats).await
    }

    /// Forgets every cached prefix (their KV would be stale after a weight change made
    /// outside [`Self::load_weights`], which clears it itself). Live sequences and pins
    /// keep their blocks.
    pub async fn clear_prefix_cache(&self) -> Result<(), EngineError> {
        self.call(Command::ClearPrefixCache).await
    }

    /// Resolves once new work may start without adding to memory pressure: no
    /// sequence waited for KV room or was preempted in the last step and at least
    /// `min_available_blocks` blocks are free or evictable (or nothing runs at all).
    /// Callers that start work of their own (prompts, branches) wait here first, so a
    /// full pool admits less instead of preempting more.
    pub async fn wait_for_kv_room(&self, min_available_blocks: usize) -> Result<(), EngineError> {
        self.call(|r| Command::WaitForKvRoom(min_available_blocks, r))
            .await
    }
}

/// What the engine thread owes callers: replies that wait on later steps.
#[derive(Default)]
struct Waiters {
    /// Generations by sequence.
    generations: std::collections::HashMap<SeqId, Reply<Generation>>,
    /// Where the tokens of streaming generations go, by sequence.
    streams: std::collections::HashMap<SeqId, TokenSender>,
    /// Prefills by sequence (several callers may wait on one).
    prefills: std::collections::HashMap<SeqId, Vec<Reply<()>>>,
    /// Callers waiting for KV room, with the free blocks each needs.
    kv_room: Vec<(usize, Reply<()>)>,
    /// A weight swap waiting for in-flight generations and prefills to finish.
    swap: Option<(Arc<Model>, Option<WeightVersion>, Reply<WeightVersion>)>,
    /// Commands sent after a waiting swap, applied in order once it is done.
    deferred: std::collections::VecDeque<Command>,
}

impl Waiters {
    /// Fails every reply owed (the engine thread died): generations, prefills, room
    /// waits, a waiting swap and the commands held behind it. Streams just end.
    fn fail_all(&mut self, err: &dyn Fn() -> EngineError) {
        for (_, reply) in self.generations.drain() {
            let _ = reply.send(Err(err()));
        }
        for reply in self.prefills.drain().flat_map(|(_, r)| r) {
            let _ = reply.send(Err(err()));
        }
        for (_, reply) in self.kv_room.drain(..) {
            let _ = reply.send(Err(err()));
        }
        if let Some((_, _, reply)) = self.swap.take() {
            let _ = reply.send(Err(err()));
        }
        for cmd in self.deferred.drain(..) {
            cmd.fail(err());
        }
        self.streams.clear();
    }

    /// Applies `cmd` now, or holds it back behind a waiting swap.
    fn take(&mut self, core: &mut EngineCore, cmd: Command) {
        if self.swap.is_some() {
            self.deferred.push_back(cmd);
        } else {
            apply(core, cmd, self);
        }
    }

    /// Applies a waiting swap once nothing is in flight, then the commands held back
    /// behind it (up to the next swap that has to wait).
    fn settle_swap(&mut self, core: &mut EngineCore) {
        while self.swap.is_some() && core.can_swap_weights() {
            let (weights, version, reply) = self.swap.take().expect("checked above");
            let _ = reply.send(match version {
                Some(v) => core.swap_weights_as(weights, v),
                None => core.swap_weights(weights),
            });
            while self.swap.is_none() {
                let Some(cmd) = self.deferred.pop_front() else {
                    break;
                };
                apply(core, cmd, self);
            }
        }
    }
}

/// The engine thread: serves commands until every handle is gone. A panic is caught:
/// every caller owed a reply, and every later one, gets [`EngineError::Died`] naming
/// it (see `death.rs`), and nothing more is computed.
fn run(mut core: EngineCore, rx: mpsc::Receiver<Command>, death: &Death) {
    let mut waiters = Waiters::default();
    // The core and the waiters are not touched again after a panic but to fail the
    // replies they hold, so observing them half-updated is harmless.
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve(&mut core, &rx, &mut waiters)
    }));
    let Err(payload) = served else { return };
    let message = panic_message(payload.as_ref());
    death.record(message.clone());
    let died = || EngineError::Died {
        message: message.clone(),
    };
    waiters.fail_all(&died);
    // Its drop could assert on the state the panic left (KV refcounts): leaked, as the
    // process is about to end anyway.
    std::mem::forget(core);
    for cmd in rx.iter() {
        cmd.fail(died());
    }
}

/// Applies commands, steps while there is work, delivers results; returns when every
/// handle is gone.
fn serve(core: &mut EngineCore, rx: &mpsc::Receiver<Command>, waiters: &mut Waiters) {
    loop {
        // Block for a command only when idle; otherwise take what has arrived.
        let first = if core.has_work() {
            match rx.try_recv() {
                Ok(c) => Some(c),
                Err(mpsc::TryRecvError::Empty) => None,
                Err(mpsc::TryRecvError::Disconnected) => return,
            }
        } else {
            match rx.recv() {
                Ok(c) => Some(c),
                Err(_) => return,
            }
        };
        let mut next = first;
        while let Some(cmd) = next {
            waiters.take(core, cmd);
            next = rx.try_recv().ok();
        }
        waiters.settle_swap(core);
        if core.has_work() {
            #[cfg(feature = "fault-injection")]
            super::death::before_step();
            if let Err(e) = core.step() {
                // A failed step fails every waiting caller: nothing is dropped
                // silently, and the engine keeps serving.
                let cause = Arc::new(e);
                for (_, reply) in waiters.generations.drain() {
                    let _ = reply.send(Err(EngineError::Step(cause.clone())));
                }
                for reply in waiters.prefills.drain().flat_map(|(_, r)| r) {
                    let _ = reply.send(Err(EngineError::Step(cause.clone())));
                }
                waiters.streams.clear();
            }
        }
        for (seq, token) in core.take_streamed() {
            if let Some(stream) = waiters.streams.get(&seq) {
                // A receiver that went away only stops hearing the tokens.
                let _ = stream.send(token);
            }
        }
        for (seq, result) in core.take_finished() {
            waiters.streams.remove(&seq);
            if let Some(reply) = waiters.generations.remove(&seq) {
                let _ = reply.send(result);
            }
        }
        for (seq, mut result) in core.take_flushed() {
            for reply in waiters.prefills.remove(&seq).unwrap_or_default() {
                let _ = reply.send(match &mut result {
                    Ok(()) => Ok(()),
                    Err(e) => Err(e.replicate()),
                });
            }
        }
        let (ready, still): (Vec<_>, Vec<_>) = waiters
            .kv_room
            .drain(..)
            .partition(|(min, _)| core.has_kv_room(*min));
        waiters.kv_room = still;
        for (_, reply) in ready {
            let _ = reply.send(Ok(()));
        }
        waiters.settle_swap(core);
    }
}

/// Frees a new sequence whose reply found no receiver.
fn free_orphan(core: &mut EngineCore, sent: Result<(), Result<SeqId, EngineError>>) {
    if let Err(Ok(orphan)) = sent {
        let _ = core.free(orphan);
    }
}

fn apply(core: &mut EngineCore, cmd: Command, waiters: &mut Waiters) {
    match cmd {
        // A sequence whose creator stopped waiting (its future was dropped: an aborted
        // task, a cancelled call) has no owner to free it: it is freed at once.
        Command::Add(prompt, r) => {
            let sent = r.send(core.add_sequence(&prompt));
            free_orphan(core, sent)
        }
        Command::Fork(seq, r) => {
            let sent = r.send(core.fork(seq));
            free_orphan(core, sent)
        }
        Command::Append(seq, tokens, r) => drop(r.send(core.append(seq, &tokens))),
        Command::Generate(seq, params, r) => match core.generate(seq, params) {
            Ok(()) => {
                waiters.generations.insert(seq, r);
            }
            Err(e) => drop(r.send(Err(e))),
        },
        Command::GenerateStream(seq, params, stream, r) => {
            match core.generate_streaming(seq, params) {
                Ok(()) => {
                    waiters.generations.insert(seq, r);
                    waiters.streams.insert(seq, stream);
                }
                Err(e) => drop(r.send(Err(e))),
            }
        }
        Command::Prefill(seq, r) => match core.prefill(seq) {
            Ok(()) => waiters.prefills.entry(seq).or_default().push(r),
            Err(e) => drop(r.send(Err(e))),
        },
        Command::Free(seq, r) => drop(r.send(core.free(seq))),
        Command::Pin(seq, r) => drop(r.send(core.pin(seq))),
        Command::Unpin(pin, r) => drop(r.send(core.unpin(pin))),
        Command::Tokens(seq, r) => drop(r.send(core.tokens(seq))),
        Command::SequenceTokens(seq, r) => drop(r.send(core.sequence_tokens(seq))),
        Command::Stats(r) => drop(r.send(Ok(core.stats()))),
        Command::ClearPrefixCache(r) => {
            core.clear_prefix_cache();
            drop(r.send(Ok(())));
        }
        Command::WaitForKvRoom(min, r) => waiters.kv_room.push((min, r)),
        Command::LoadWeights(weights, version, r) => waiters.swap = Some((weights, version, r)),
    }
    // A generation that finished at once (its first sample was a stop) is delivered
    // by the caller loop through `take_finished`.
}
