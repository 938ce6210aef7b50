//! The KV layer: a paged pool of KV blocks, per-sequence block tables, pinned and
//! forkable prefixes, and a prefix index that lets new sequences reuse cached blocks.
//!
//! - [`ids`] — the newtypes [`BlockId`], [`SeqId`], [`PinId`].
//! - [`error`] — [`KvError`].
//! - [`storage`] — [`KvStorage`] — per-layer `[num_blocks, kv_heads, block_size, head_dim]` K and V
//!   buffers sized from a byte budget ([`KvConfig`]), row writes, block copy: the bytes.
//! - [`pool`] — [`BlockPool`] — the one owner of every block's state (free / cached /
//!   in use): refcounts, free list, the LRU of cached blocks and the prefix index.
//! - [`table`] — [`BlockTable`] — a sequence's blocks in position order and its length.
//! - [`prefix`] — [`PrefixIndex`] — hash chain of full blocks → block (owned by the
//!   pool).
//! - [`segment`] — frozen runs of full blocks that forked tables share as one
//!   refcounted unit, so a fork or free is O(1) in the prefix length.
//! - [`cache`] — [`KvCache`] — storage + pool + sequences + pins: new / start (with prefix
//!   reuse) / fork / reserve / commit / truncate / free / pin / unpin, and counters.
//! - [`cache_view`] — `impl KvStore for KvCache`, what the model's forward writes and reads.
//!
//! # Invariants
//!
//! - A block's refcount equals its holders: the live frozen segments listing it plus
//!   the tables (sequences) and pins listing it in their own part
//!   ([`KvCache::references`] counts tables and pins instead; both are zero for the
//!   same blocks). A segment's refcount equals the tables, pins and segments ending on
//!   it. Every block is in exactly one state: *in use* (refcount > 0), *cached*
//!   (refcount 0, in the prefix index, evictable) or *free*.
//! - A block is freed (or cached) only when no table and no pin refers to it.
//! - A pinned block is never evicted (eviction takes only cached blocks, which have no
//!   references) and never written (a write to a shared block copies it first).
//! - A block is written in place only by its single holder and only while it is not
//!   in the prefix index: indexed blocks are immutable, so a cache hit always holds the
//!   KV of exactly the tokens it was indexed under.
//! - [`KvCache::reserve`] is all-or-nothing and never panics on exhaustion: it returns
//!   [`KvError::OutOfBlocks`] after evicting nothing.
//! - When every sequence is freed and every pin released, all refcounts are zero; after
//!   [`KvCache::clear_prefix_cache`] every block is free again.
//!
//! [`KvCache::check_invariants`] checks these (the property tests call it after every
//! operation).

pub mod cache;
pub mod cache_view;
pub mod error;
pub mod ids;
pub mod pool;
pub mod prefix;
pub mod segment;
pub mod storage;
pub mod table;

pub use cache::{KvCache, KvStats};
pub use error::{KvConfigError, KvError};
pub use ids::{BlockId, PinId, SeqId};
pub use pool::BlockPool;
pub use prefix::{BlockHash, PrefixIndex};
pub use storage::{KvConfig, KvStorage, DEFAULT_BLOCK_SIZE};
pub use table::{blocks_for, BlockTable};
