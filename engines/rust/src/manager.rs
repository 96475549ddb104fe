//! rustkv's paged KV-cache manager.
//!
//! Design:
//! * a pool of `num_blocks` blocks, none reserved; each block has a reference count (the
//!   number of live requests whose block table holds it) and at most one cache key;
//! * the free list is an intrusive doubly linked list over block ids (O(1) removal of a hit
//!   from the middle); new blocks are taken from its head. Freed blocks that carry no cached
//!   data go to the head (reused first, nothing is lost), freed cached blocks to the tail, so
//!   cached blocks are evicted least recently freed first (LRU), and within one request the
//!   deepest block of its chain first;
//! * the prefix cache is a hash map from a 128-bit chained key to the blocks cached under it
//!   (a key may be cached in several blocks: a request that skips reading the cache still
//!   writes its blocks; a lookup takes the oldest). A key hashes the parent block's key, the
//!   block's tokens and the block's context (LoRA adapter, multimodal items overlapping the
//!   block, cache salt on the first block), with std's SipHash run twice under two domain
//!   tags;
//! * eviction is lazy: a freed cached block keeps its key and stays a possible hit until it
//!   is popped from the free list for reuse, which drops its key;
//! * a running request's full blocks are cached as soon as `allocate_slots` schedules their
//!   tokens (never lookahead slots, never tokens beyond the request's known tokens).

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use crate::json::Value;

const NIL: usize = usize::MAX;

/// A request as the suite sends it (`RequestView`).
#[derive(Clone, Debug)]
pub struct View {
    pub request_id: String,
    /// Prompt tokens, then output tokens.
    pub tokens: Vec<i64>,
    pub num_computed_tokens: usize,
    /// The LoRA adapter as compact JSON (`[name, id, path]`), or None.
    pub lora: Option<String>,
    /// `(identifier as compact JSON, offset, length)` per multimodal item.
    pub mm: Vec<(String, i64, i64)>,
    pub cache_salt: Option<String>,
    pub skip_reading_prefix_cache: bool,
}

impl View {
    pub fn from_json(v: &Value) -> Result<View, String> {
        let request_id = match v.get("request_id") {
            Some(Value::Str(s)) => s.clone(),
            Some(other) => other.to_json(),
            None => return Err("request without request_id".into()),
        };
        let ints = |name: &str| -> Result<Vec<i64>, String> {
            match v.get(name) {
                None | Some(Value::Null) => Ok(Vec::new()),
                Some(Value::Arr(items)) => items
                    .iter()
                    .map(|t| t.as_i64().ok_or_else(|| format!("{}: not an integer: {}", name, t.to_json())))
                    .collect(),
                Some(other) => Err(format!("{}: not a list: {}", name, other.to_json())),
            }
        };
        let mut tokens = ints("prompt_token_ids")?;
        tokens.extend(ints("output_token_ids")?);
        let num_computed_tokens = match v.get("num_computed_tokens") {
            None | Some(Value::Null) => 0,
            Some(n) => to_usize(n, "num_computed_tokens")?,
        };
        let lora = match v.get("lora") {
            None | Some(Value::Null) => None,
            Some(l) => Some(l.to_json()),
        };
        let mut mm = Vec::new();
        if let Some(Value::Arr(items)) = v.get("mm_features") {
            for item in items {
                let parts = item.as_array().ok_or("mm_features: an item is not a list")?;
                if parts.len() < 3 {
                    return Err("mm_features: an item is not [identifier, offset, length]".into());
                }
                let offset = parts[1].as_i64().ok_or("mm_features: offset not an integer")?;
                let length = parts[2].as_i64().ok_or("mm_features: length not an integer")?;
                mm.push((parts[0].to_json(), offset, length));
            }
        }
        let cache_salt = match v.get("cache_salt") {
            None | Some(Value::Null) => None,
            Some(Value::Str(s)) => Some(s.clone()),
            Some(other) => Some(other.to_json()),
        };
        let skip_reading_prefix_cache =
            v.get("skip_reading_prefix_cache").and_then(Value::as_bool).unwrap_or(false);
        Ok(View { request_id, tokens, num_computed_tokens, lora, mm, cache_salt, skip_reading_prefix_cache })
    }

    pub fn num_tokens(&self) -> usize {
        self.tokens.len()
    }
}

pub fn to_usize(v: &Value, name: &str) -> Result<usize, String> {
    match v.as_i64() {
        Some(i) if i >= 0 => Ok(i as usize),
        _ => Err(format!("{}: not a non-negative integer: {}", name, v.to_json())),
    }
}

/// The cache key of block `index` of `view`, chained to its parent block's key.
fn block_key(parent: u128, view: &View, index: usize, block_size: usize) -> u128 {
    let start = index * block_size;
    let end = start + block_size;
    let feed = |h: &mut DefaultHasher| {
        parent.hash(h);
        view.tokens[start..end].hash(h);
        // The context, each part tagged so no two kinds can collide.
        match &view.lora {
            Some(l) => {
                1u8.hash(h);
                l.hash(h);
            }
            None => 0u8.hash(h),
        }
        for (ident, offset, length) in &view.mm {
            // Half-open overlap of [offset, offset + length) with [start, end).
            if *offset < end as i64 && offset + length > start as i64 {
                2u8.hash(h);
                ident.hash(h);
                (offset - start as i64).hash(h);
            }
        }
        if index == 0 {
            match &view.cache_salt {
                Some(s) => {
                    3u8.hash(h);
                    s.hash(h);
                }
                None => 4u8.hash(h),
            }
        }
    };
    let mut a = DefaultHasher::new();
    "rustkv/a".hash(&mut a);
    feed(&mut a);
    let mut b = DefaultHasher::new();
    "rustkv/b".hash(&mut b);
    feed(&mut b);
    ((a.finish() as u128) << 64) | b.finish() as u128
}

/// Keys of the first `num_blocks` full blocks of `view`, extending `keys` (a prefix of them).
fn extend_keys(keys: &mut Vec<u128>, view: &View, num_blocks: usize, block_size: usize) {
    while keys.len() < num_blocks {
        let i = keys.len();
        let parent = if i == 0 { 0 } else { keys[i - 1] };
        keys.push(block_key(parent, view, i, block_size));
    }
}

struct RequestState {
    /// The block table in logical order.
    table: Vec<usize>,
    /// Table entries already considered for caching (a prefix of the table).
    num_cached: usize,
    /// Chained keys of the request's full blocks computed so far.
    keys: Vec<u128>,
}

pub struct Manager {
    block_size: usize,
    num_blocks: usize,
    caching: bool,
    max_model_len: Option<usize>,
    refs: Vec<u32>,
    key: Vec<Option<u128>>,
    // The free list: prev/next links, head first.
    prev: Vec<usize>,
    next: Vec<usize>,
    in_free: Vec<bool>,
    head: usize,
    tail: usize,
    num_free: usize,
    cache: HashMap<u128, Vec<usize>>,
    requests: HashMap<String, RequestState>,
}

impl Manager {
    pub fn new(num_blocks: usize, block_size: usize, caching: bool, max_model_len: Option<usize>) -> Manager {
        let mut m = Manager {
            block_size,
            num_blocks,
            caching,
            max_model_len,
            refs: vec![0; num_blocks],
            key: vec![None; num_blocks],
            prev: vec![NIL; num_blocks],
            next: vec![NIL; num_blocks],
            in_free: vec![false; num_blocks],
            head: NIL,
            tail: NIL,
            num_free: 0,
            cache: HashMap::new(),
            requests: HashMap::new(),
        };
        for b in 0..num_blocks {
            m.push_tail(b);
        }
        m
    }

    // ---- the free list ----

    fn push_tail(&mut self, b: usize) {
        debug_assert!(!self.in_free[b]);
        self.prev[b] = self.tail;
        self.next[b] = NIL;
        if self.tail == NIL {
            self.head = b;
        } else {
            self.next[self.tail] = b;
        }
        self.tail = b;
        self.in_free[b] = true;
        self.num_free += 1;
    }

    fn push_head(&mut self, b: usize) {
        debug_assert!(!self.in_free[b]);
        self.next[b] = self.head;
        self.prev[b] = NIL;
        if self.head == NIL {
            self.tail = b;
        } else {
            self.prev[self.head] = b;
        }
        self.head = b;
        self.in_free[b] = true;
        self.num_free += 1;
    }

    fn unlink(&mut self, b: usize) {
        debug_assert!(self.in_free[b]);
        let (p, n) = (self.prev[b], self.next[b]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n] = p;
        }
        self.prev[b] = NIL;
        self.next[b] = NIL;
        self.in_free[b] = false;
        self.num_free -= 1;
    }

    /// Takes the head of the free list for reuse: its cache entry is evicted.
    fn pop_free(&mut self) -> usize {
        let b = self.head;
        assert!(b != NIL, "pop from an empty free list");
        self.unlink(b);
        self.evict(b);
        self.refs[b] = 1;
        b
    }

    fn evict(&mut self, b: usize) {
        if let Some(k) = self.key[b].take() {
            if let Some(blocks) = self.cache.get_mut(&k) {
                blocks.retain(|&x| x != b);
                if blocks.is_empty() {
                    self.cache.remove(&k);
                }
            }
        }
    }

    // ---- the manager protocol ----

    pub fn num_free_blocks(&self) -> usize {
        self.num_free
    }

    pub fn free_block_ids(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut b = self.head;
        while b != NIL && out.len() <= self.num_blocks {
            out.push(b);
            b = self.next[b];
        }
        out
    }

    pub fn ref_cnt(&self, b: usize) -> Result<u32, String> {
        self.refs.get(b).copied().ok_or_else(|| format!("block id {} out of range", b))
    }

    pub fn get_block_ids(&self, rid: &str) -> Vec<usize> {
        self.requests.get(rid).map(|s| s.table.clone()).unwrap_or_default()
    }

    /// The longest cached prefix of whole blocks, at most `num_tokens - 1` tokens. No side
    /// effects.
    pub fn get_computed_blocks(&self, view: &View) -> (Vec<usize>, usize) {
        if !self.caching || view.skip_reading_prefix_cache || view.num_tokens() == 0 {
            return (Vec::new(), 0);
        }
        let max_blocks = (view.num_tokens() - 1) / self.block_size;
        let mut hits = Vec::new();
        let mut parent = 0u128;
        for i in 0..max_blocks {
            let k = block_key(parent, view, i, self.block_size);
            match self.cache.get(&k).and_then(|blocks| blocks.first()) {
                Some(&b) => hits.push(b),
                None => break,
            }
            parent = k;
        }
        let n = hits.len() * self.block_size;
        (hits, n)
    }

    /// Slots for the request's computed tokens, the hits, the new tokens and the lookahead
    /// slots: the newly allocated blocks, or None (nothing changed) when the pool is short.
    pub fn allocate_slots(
        &mut self,
        view: &View,
        num_new_tokens: usize,
        num_new_computed_tokens: usize,
        hits: &[usize],
        num_lookahead_tokens: usize,
    ) -> Result<Option<Vec<usize>>, String> {
        for &b in hits {
            if b >= self.num_blocks {
                return Err(format!("new_computed_block_ids: block id {} out of range", b));
            }
        }
        let table_len = self.requests.get(&view.request_id).map_or(0, |s| s.table.len());
        let computed = view.num_computed_tokens + num_new_computed_tokens;
        let mut need = computed + num_new_tokens + num_lookahead_tokens;
        if let Some(cap) = self.max_model_len {
            need = need.min(cap);
        }
        let blocks_needed = need.div_ceil(self.block_size);
        let num_new = blocks_needed.saturating_sub(table_len + hits.len());
        let mut seen = HashSet::new();
        let free_hits = hits.iter().filter(|&&b| self.refs[b] == 0 && seen.insert(b)).count();
        if num_new + free_hits > self.num_free {
            return Ok(None); // all or nothing: nothing changed
        }
        // Touch the hits first, so the new blocks never evict the request's own prefix.
        for &b in hits {
            if self.in_free[b] {
                self.unlink(b);
            }
            self.refs[b] += 1;
        }
        let new: Vec<usize> = (0..num_new).map(|_| self.pop_free()).collect();
        let block_size = self.block_size;
        let state = self
            .requests
            .entry(view.request_id.clone())
            .or_insert_with(|| RequestState { table: Vec::new(), num_cached: 0, keys: Vec::new() });
        state.table.extend_from_slice(hits);
        state.table.extend_from_slice(&new);
        if self.caching {
            // Lookahead slots and tokens the view does not hold yet are never cached.
            let tokens = (computed + num_new_tokens).min(view.num_tokens());
            let full = (tokens / block_size).min(state.table.len());
            if full > state.num_cached {
                extend_keys(&mut state.keys, view, full, block_size);
                for i in state.num_cached..full {
                    let b = state.table[i];
                    if self.key[b].is_none() {
                        let k = state.keys[i];
                        self.key[b] = Some(k);
                        self.cache.entry(k).or_default().push(b);
                    }
                }
                state.num_cached = full;
            }
        }
        Ok(Some(new))
    }

    /// Releases the request's blocks, last block first; an unknown id is a no-op.
    pub fn free(&mut self, rid: &str) {
        let Some(state) = self.requests.remove(rid) else { return };
        for &b in state.table.iter().rev() {
            self.refs[b] -= 1;
            if self.refs[b] == 0 {
                if self.key[b].is_some() {
                    self.push_tail(b); // cached: evicted last, least recently freed first
                } else {
                    self.push_head(b); // nothing cached in it: reused first
                }
            }
        }
    }

    /// Drops every cached key when no block is in use; false (nothing changed) otherwise.
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.refs.iter().any(|&r| r > 0) {
            return false;
        }
        self.cache.clear();
        for k in self.key.iter_mut() {
            *k = None;
        }
        true
    }

    /// Flat slots of positions `[start, end)` of the request.
    pub fn slot_mapping(&self, rid: &str, start: usize, end: usize) -> Result<Vec<i64>, String> {
        let table = self.requests.get(rid).map(|s| s.table.as_slice()).unwrap_or(&[]);
        let mut out = Vec::with_capacity(end.saturating_sub(start));
        for p in start..end {
            let b = *table.get(p / self.block_size).ok_or_else(|| {
                format!("slot_mapping({:?}, {}, {}): position {} is beyond the block table ({} blocks)",
                        rid, start, end, p, table.len())
            })?;
            out.push((b * self.block_size + p % self.block_size) as i64);
        }
        Ok(out)
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// rustkv's own invariants; an error names the first broken one.
    #[allow(clippy::needless_range_loop)]
    pub fn check_invariants(&self) -> Result<(), String> {
        // The free list: a well-linked list of num_free distinct blocks, exactly those with
        // no reference.
        let mut count = 0;
        let mut prev = NIL;
        let mut b = self.head;
        let mut seen = vec![false; self.num_blocks];
        while b != NIL {
            if count > self.num_blocks {
                return Err("free list: a cycle".into());
            }
            if seen[b] {
                return Err(format!("free list: block {} twice", b));
            }
            seen[b] = true;
            if !self.in_free[b] {
                return Err(format!("free list: block {} linked but not marked free", b));
            }
            if self.prev[b] != prev {
                return Err(format!("free list: block {} has a wrong back link", b));
            }
            if self.refs[b] != 0 {
                return Err(format!("free list: block {} has ref_cnt {}", b, self.refs[b]));
            }
            count += 1;
            prev = b;
            b = self.next[b];
        }
        if prev != self.tail {
            return Err("free list: the tail is not the last block".into());
        }
        if count != self.num_free {
            return Err(format!("free list: {} blocks linked, free count {}", count, self.num_free));
        }
        for b in 0..self.num_blocks {
            if self.in_free[b] != seen[b] {
                return Err(format!("block {}: marked free {} but linked {}", b, self.in_free[b], seen[b]));
            }
            if self.refs[b] == 0 && !seen[b] {
                return Err(format!("block {}: ref_cnt 0 but not in the free list (lost)", b));
            }
        }
        // Reference counts: one per block table holding the block; no table lists one twice.
        let mut holders = vec![0u32; self.num_blocks];
        for (rid, state) in &self.requests {
            let mut in_table = HashSet::new();
            for &b in &state.table {
                if !in_table.insert(b) {
                    return Err(format!("request {:?}: block {} twice in its table", rid, b));
                }
                holders[b] += 1;
            }
            if state.num_cached > state.table.len() {
                return Err(format!("request {:?}: {} blocks cached but {} in its table",
                                   rid, state.num_cached, state.table.len()));
            }
            if self.caching {
                for i in 0..state.num_cached {
                    let b = state.table[i];
                    if self.key[b] != Some(state.keys[i]) {
                        return Err(format!("request {:?}: its full block {} (block {}) is not cached under its key",
                                           rid, i, b));
                    }
                }
            }
        }
        for b in 0..self.num_blocks {
            if holders[b] != self.refs[b] {
                return Err(format!("block {}: ref_cnt {} but {} block tables hold it", b, self.refs[b], holders[b]));
            }
        }
        // The cache map and the blocks' keys agree.
        let mut mapped = 0;
        for (k, blocks) in &self.cache {
            if blocks.is_empty() {
                return Err("cache: a key with no block".into());
            }
            for &b in blocks {
                if self.key[b] != Some(*k) {
                    return Err(format!("cache: block {} is mapped under a key it does not carry", b));
                }
                mapped += 1;
            }
        }
        let keyed = self.key.iter().filter(|k| k.is_some()).count();
        if keyed != mapped {
            return Err(format!("cache: {} blocks carry a key but {} are mapped", keyed, mapped));
        }
        if !self.caching && keyed > 0 {
            return Err("caching is off but blocks are cached".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(rid: &str, tokens: Vec<i64>, computed: usize) -> View {
        View {
            request_id: rid.into(),
            tokens,
            num_computed_tokens: computed,
            lora: None,
            mm: Vec::new(),
            cache_salt: None,
            skip_reading_prefix_cache: false,
        }
    }

    #[test]
    fn hits_and_lazy_eviction() {
        let mut m = Manager::new(4, 2, true, None);
        let a = view("a", vec![1, 2, 3, 4, 5], 0);
        assert_eq!(m.allocate_slots(&a, 5, 0, &[], 0).unwrap(), Some(vec![0, 1, 2]));
        m.check_invariants().unwrap();
        let b = view("b", vec![1, 2, 3, 4, 9], 0);
        assert_eq!(m.get_computed_blocks(&b), (vec![0, 1], 4));
        m.free("a");
        m.check_invariants().unwrap();
        assert_eq!(m.num_free_blocks(), 4);
        assert_eq!(m.get_computed_blocks(&b), (vec![0, 1], 4));
        assert_eq!(m.allocate_slots(&b, 1, 4, &[0, 1], 0).unwrap(), Some(vec![2]));
        m.check_invariants().unwrap();
        assert_eq!(m.get_block_ids("b"), vec![0, 1, 2]);
        // Too big: nothing changes.
        let c = view("c", (100..110).collect(), 0);
        assert_eq!(m.allocate_slots(&c, 10, 0, &[], 0).unwrap(), None);
        m.check_invariants().unwrap();
        m.free("b");
        assert!(m.reset_prefix_cache());
        assert_eq!(m.get_computed_blocks(&b), (vec![], 0));
        m.check_invariants().unwrap();
    }
}
