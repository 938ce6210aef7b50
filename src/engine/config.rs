//! The engine's limits: KV budget, block size, batch caps, prefix caching.

/// Scheduler limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Bytes of KV cache (all layers, keys and values).
    pub kv_budget_bytes: usize,
    /// Positions per KV block.
    pub block_size: usize,
    /// Most rows (tokens) in one forward.
    pub max_batch_tokens: usize,
    /// Most sequences in one forward.
    pub max_batch_seqs: usize,
    /// Let new sequences start from cached blocks of an identical prompt prefix.
    pub prefix_cache: bool,
    /// Evict the least recently released cached block before writing pool memory never
    /// written: a smaller resident set and fewer page faults, a prefix cache no larger
    /// than the memory already written. For jobs that do not look released prefixes up
    /// again (rollout, train); a server keeps it off.
    pub reuse_cached_first: bool,
}

impl EngineConfig {
    /// The KV budget when the user names none: a quarter of the memory available now
    /// (`MemAvailable`), between 512 MiB and 8 GiB; 1 GiB where the figure cannot be
    /// read. The pool's pages cost memory only once written, and preemption keeps a
    /// smaller pool correct (only slower), so the default leans large.
    pub fn auto_kv_budget_bytes() -> usize {
        const MIB: usize = 1 << 20;
        let available = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|text| {
                let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
                let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
                Some(kib * 1024)
            });
        match available {
            Some(bytes) => (bytes / 4).clamp(512 * MIB, 8192 * MIB),
            None => 1024 * MIB,
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            kv_budget_bytes: 1 << 30,
            block_size: crate::kv::DEFAULT_BLOCK_SIZE,
            max_batch_tokens: 512,
            max_batch_seqs: 64,
            prefix_cache: true,
            reuse_cached_first: false,
        }
    }
}
