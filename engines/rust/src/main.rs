//! rustkv: a paged KV-cache manager speaking kvcheck's wire protocol (docs/wire-protocol.md):
//! JSON Lines requests on standard input, one answer line each on standard output, logs on
//! standard error.

mod batch;
mod json;
mod manager;

use std::collections::HashMap;
use std::io::{self, BufRead, Write};
use std::panic::{self, AssertUnwindSafe};

use json::{obj, Value};
use manager::{to_usize, Manager, View};

const PROTOCOL: i64 = 1;
/// Pools larger than this are declined (memory), and declared in `num_blocks_range`.
const MAX_NUM_BLOCKS: usize = 1 << 22;

const CAPABILITIES: &[&str] = &[
    "manager",
    "prefix_caching",
    "ref_counts",
    "free_queue_order",
    "invariants",
    "reset_prefix_cache",
    "caching_off",
    "skip_reading_prefix_cache",
    "lookahead",
    "multi_token_decode",
    "caches_running_requests",
    "slot_mapping",
    "batch_metadata",
    "lora",
    "multimodal",
    "cache_salt",
];

/// An error answer: the wire's code and a message.
struct Failure {
    code: &'static str,
    message: String,
}

impl Failure {
    fn internal(message: impl Into<String>) -> Failure {
        Failure { code: "internal", message: message.into() }
    }
    fn not_supported(message: impl Into<String>) -> Failure {
        Failure { code: "not_supported", message: message.into() }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::internal(message)
    }
}

impl From<batch::BatchError> for Failure {
    fn from(e: batch::BatchError) -> Failure {
        match e {
            batch::BatchError::NotSupported(m) => Failure::not_supported(m),
            batch::BatchError::Invalid(m) => Failure::internal(m),
        }
    }
}

type Answer = Result<Value, Failure>;

fn impl_info() -> Value {
    obj(vec![
        ("name", "rustkv".into()),
        ("version", env!("CARGO_PKG_VERSION").into()),
        ("profile", "generic".into()),
        ("capabilities", Value::from(CAPABILITIES.to_vec())),
        ("hash_algos", Value::Arr(Vec::new())),
        ("reserved_block_ids", Value::Null),
        ("block_sizes", Value::Null),
        ("num_blocks_range", Value::from(vec![1usize, MAX_NUM_BLOCKS])),
        ("ref_cnt_counts_cache", false.into()),
        ("commit", Value::Null),
    ])
}

// ---- parameter helpers ----

fn param<'a>(params: &'a Value, name: &str) -> Result<&'a Value, Failure> {
    params.get(name).ok_or_else(|| Failure::internal(format!("missing parameter {:?}", name)))
}

fn param_usize(params: &Value, name: &str) -> Result<usize, Failure> {
    Ok(to_usize(param(params, name)?, name)?)
}

fn param_str(params: &Value, name: &str) -> Result<String, Failure> {
    match param(params, name)? {
        Value::Str(s) => Ok(s.clone()),
        other => Ok(other.to_json()),
    }
}

fn usize_list(v: &Value, name: &str) -> Result<Vec<usize>, Failure> {
    let items = v.as_array().ok_or_else(|| Failure::internal(format!("{}: not a list", name)))?;
    items.iter().map(|x| Ok(to_usize(x, name)?)).collect()
}

fn int_rows(v: &Value, name: &str) -> Result<Vec<Vec<i64>>, Failure> {
    let rows = v.as_array().ok_or_else(|| Failure::internal(format!("{}: not a list", name)))?;
    rows.iter()
        .map(|row| {
            let items = row.as_array().ok_or_else(|| Failure::internal(format!("{}: a row is not a list", name)))?;
            items
                .iter()
                .map(|x| x.as_i64().ok_or_else(|| Failure::internal(format!("{}: not an integer", name))))
                .collect()
        })
        .collect()
}

fn ids(list: Vec<usize>) -> Value {
    Value::from(list)
}

fn ints(list: Vec<i64>) -> Value {
    Value::from(list)
}

// ---- the engine ----

struct Engine {
    managers: HashMap<i64, Manager>,
    next_handle: i64,
}

impl Engine {
    fn new() -> Engine {
        Engine { managers: HashMap::new(), next_handle: 1 }
    }

    fn make_manager(&mut self, params: &Value) -> Answer {
        let spec = param(params, "spec")?;
        if let Some(groups) = spec.get("kv_cache_groups") {
            if groups.as_array().is_some_and(|g| !g.is_empty()) {
                return Err(Failure::not_supported("rustkv has one full-attention group (no kv_cache_groups)"));
            }
        }
        let num_blocks = param_usize(spec, "num_blocks")?;
        let block_size = param_usize(spec, "block_size")?;
        if block_size == 0 {
            return Err(Failure::not_supported("block_size 0"));
        }
        if num_blocks > MAX_NUM_BLOCKS {
            return Err(Failure::not_supported(format!("num_blocks {} > {}", num_blocks, MAX_NUM_BLOCKS)));
        }
        let caching = spec.get("enable_caching").and_then(Value::as_bool).unwrap_or(true);
        let max_model_len = match spec.get("max_model_len") {
            None | Some(Value::Null) => None,
            Some(v) => Some(to_usize(v, "max_model_len")?),
        };
        let handle = self.next_handle;
        self.next_handle += 1;
        self.managers.insert(handle, Manager::new(num_blocks, block_size, caching, max_model_len));
        eprintln!("rustkv: manager {} over {} blocks of {} tokens (caching {})", handle, num_blocks, block_size, caching);
        Ok(obj(vec![("handle", Value::Int(handle))]))
    }

    fn call_manager(&mut self, handle: i64, method: &str, params: &Value) -> Answer {
        let m = self
            .managers
            .get_mut(&handle)
            .ok_or_else(|| Failure::internal(format!("unknown handle {}", handle)))?;
        match method {
            "get_computed_blocks" => {
                let view = View::from_json(param(params, "request")?)?;
                let (hits, n) = m.get_computed_blocks(&view);
                Ok(Value::Arr(vec![ids(hits), Value::from(n)]))
            }
            "allocate_slots" => {
                let view = View::from_json(param(params, "request")?)?;
                let new = m.allocate_slots(
                    &view,
                    param_usize(params, "num_new_tokens")?,
                    param_usize(params, "num_new_computed_tokens")?,
                    &usize_list(param(params, "new_computed_block_ids")?, "new_computed_block_ids")?,
                    param_usize(params, "num_lookahead_tokens")?,
                )?;
                Ok(new.map_or(Value::Null, ids))
            }
            "free" => {
                m.free(&param_str(params, "request_id")?);
                Ok(Value::Null)
            }
            "get_block_ids" => Ok(ids(m.get_block_ids(&param_str(params, "request_id")?))),
            "num_free_blocks" => Ok(Value::from(m.num_free_blocks())),
            "reset_prefix_cache" => Ok(Value::Bool(m.reset_prefix_cache())),
            "free_block_ids" => Ok(ids(m.free_block_ids())),
            "ref_cnt" => Ok(Value::Int(m.ref_cnt(param_usize(params, "block_id")?)? as i64)),
            "slot_mapping" => Ok(ints(m.slot_mapping(
                &param_str(params, "request_id")?,
                param_usize(params, "start")?,
                param_usize(params, "end")?,
            )?)),
            "check_invariants" => match m.check_invariants() {
                Ok(()) => Ok(Value::Null),
                Err(message) => Err(Failure { code: "violation", message }),
            },
            "build_batch" => {
                let (slots, positions, reqs) = batch::build_batch(
                    m.block_size(),
                    &int_rows(param(params, "block_tables")?, "block_tables")?,
                    &usize_list(param(params, "num_computed_tokens")?, "num_computed_tokens")?,
                    &usize_list(param(params, "num_scheduled_tokens")?, "num_scheduled_tokens")?,
                    param_usize(params, "num_padded_tokens")?,
                    param_usize(params, "dcp_world_size")?,
                    param_usize(params, "dcp_rank")?,
                    param_usize(params, "cp_kv_cache_interleave_size")?,
                )?;
                Ok(Value::Arr(vec![ints(slots), ints(positions), ints(reqs)]))
            }
            "flashinfer_csr" => {
                let (indptr, indices, last) = batch::flashinfer_csr(
                    m.block_size(),
                    &int_rows(param(params, "block_tables")?, "block_tables")?,
                    &usize_list(param(params, "seq_lens")?, "seq_lens")?,
                )?;
                Ok(Value::Arr(vec![ints(indptr), ints(indices), ints(last)]))
            }
            "req_to_token" => {
                let rows = batch::req_to_token(
                    m.block_size(),
                    &int_rows(param(params, "block_tables")?, "block_tables")?,
                    &usize_list(param(params, "seq_lens")?, "seq_lens")?,
                )?;
                Ok(Value::Arr(rows.into_iter().map(ints).collect()))
            }
            _ => Err(Failure::internal(format!("rustkv does not implement manager method {:?}", method))),
        }
    }

    /// Answers one request. `Ok(true)` after `shutdown`.
    fn handle(&mut self, req: &Value) -> (Answer, bool) {
        let method = req.get("method").and_then(Value::as_str).unwrap_or("");
        let empty = Value::Obj(Vec::new());
        let params = match req.get("params") {
            Some(p @ Value::Obj(_)) => p,
            _ => &empty,
        };
        let answer = match method {
            "init" => Ok(obj(vec![("protocol", Value::Int(PROTOCOL)), ("impl_info", impl_info())])),
            "shutdown" => return (Ok(Value::Null), true),
            "release" => {
                if let Some(Value::Arr(handles)) = params.get("handles") {
                    for h in handles {
                        if let Some(h) = h.as_i64() {
                            self.managers.remove(&h);
                        }
                    }
                }
                Ok(Value::Null)
            }
            "make_kv_cache_manager" => self.make_manager(params),
            "make_block_pool" | "make_indexer" => {
                Err(Failure::not_supported(format!("rustkv has no {}", method.trim_start_matches("make_"))))
            }
            _ => match req.get("handle").and_then(Value::as_i64) {
                Some(handle) => self.call_manager(handle, method, params),
                None => Err(Failure::internal(format!("unknown method {:?}", method))),
            },
        };
        (answer, false)
    }
}

fn answer_line(id: Value, answer: Answer) -> String {
    let body = match answer {
        Ok(result) => obj(vec![("id", id), ("result", result)]),
        Err(f) => obj(vec![
            ("id", id),
            ("error", obj(vec![("code", f.code.into()), ("message", f.message.into())])),
        ]),
    };
    let mut line = body.to_json();
    line.push('\n');
    line
}

fn main() {
    let stdin = io::stdin();
    let mut input = stdin.lock();
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let mut engine = Engine::new();
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match input.read_until(b'\n', &mut buf) {
            Ok(0) => break, // end of input
            Ok(_) => {}
            Err(e) => {
                eprintln!("rustkv: reading stdin: {}", e);
                break;
            }
        }
        let text = String::from_utf8_lossy(&buf);
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let (line, stop) = match json::parse(text) {
            Err(e) => {
                eprintln!("rustkv: a request that is not JSON: {}", e);
                (answer_line(Value::Null, Err(Failure::internal(format!("request is not JSON: {}", e)))), false)
            }
            Ok(req) => {
                let id = req.get("id").cloned().unwrap_or(Value::Null);
                let method = req.get("method").and_then(Value::as_str).unwrap_or("").to_string();
                let result = panic::catch_unwind(AssertUnwindSafe(|| engine.handle(&req)));
                let (answer, stop) = match result {
                    Ok(r) => r,
                    Err(cause) => {
                        let what = cause
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| cause.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_else(|| "panic".into());
                        (Err(Failure::internal(format!("{} panicked: {}", method, what))), false)
                    }
                };
                if let Err(f) = &answer {
                    eprintln!("rustkv: {} -> {}: {}", method, f.code, f.message);
                }
                (answer_line(id, answer), stop)
            }
        };
        if out.write_all(line.as_bytes()).and_then(|_| out.flush()).is_err() {
            eprintln!("rustkv: standard output closed");
            break;
        }
        if stop {
            break;
        }
    }
    let _ = out.flush();
}
