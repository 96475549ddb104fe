//! Worker-side batch metadata (capability `batch_metadata`): slot mapping of a step with
//! decode context parallelism, FlashInfer's CSR page table and SGLang's `req_to_token`.
//! These read no manager state: every block table is passed in.

/// Three parallel lists of ints (the shape of `build_batch` and `flashinfer_csr` answers).
pub type Triple = (Vec<i64>, Vec<i64>, Vec<i64>);

pub enum BatchError {
    /// Arguments this design declines (kvcheck skips them).
    NotSupported(String),
    /// Arguments no answer exists for.
    Invalid(String),
}

fn row_block(row: &[i64], index: usize, what: &str) -> Result<i64, BatchError> {
    row.get(index).copied().ok_or_else(|| {
        BatchError::Invalid(format!("{}: block index {} beyond a row of {} blocks", what, index, row.len()))
    })
}

/// One step's `(slot_mapping, positions, req_indices)`.
#[allow(clippy::too_many_arguments)]
pub fn build_batch(
    block_size: usize,
    tables: &[Vec<i64>],
    num_computed: &[usize],
    num_scheduled: &[usize],
    num_padded: usize,
    world: usize,
    rank: usize,
    interleave: usize,
) -> Result<Triple, BatchError> {
    if world == 0 || rank >= world {
        return Err(BatchError::NotSupported(format!("dcp_rank {} of dcp_world_size {}", rank, world)));
    }
    #[allow(clippy::manual_is_multiple_of)] // keeps older toolchains building
    if interleave == 0 || block_size % interleave != 0 {
        return Err(BatchError::NotSupported(format!(
            "cp_kv_cache_interleave_size {} does not divide block_size {}", interleave, block_size)));
    }
    if num_computed.len() != num_scheduled.len() || tables.len() < num_scheduled.len() {
        return Err(BatchError::Invalid(format!(
            "{} block tables, {} computed counts, {} scheduled counts",
            tables.len(), num_computed.len(), num_scheduled.len())));
    }
    let bs = block_size;
    let virtual_block = bs * world;
    let total: usize = num_scheduled.iter().sum();
    let mut slots = Vec::with_capacity(total.max(num_padded));
    let mut positions = Vec::with_capacity(total);
    let mut req_indices = Vec::with_capacity(total);
    for (r, (&computed, &scheduled)) in num_computed.iter().zip(num_scheduled).enumerate() {
        let row = &tables[r];
        for pos in computed..computed + scheduled {
            req_indices.push(r as i64);
            positions.push(pos as i64);
            let slot = if world == 1 {
                row_block(row, pos / bs, "build_batch")? * bs as i64 + (pos % bs) as i64
            } else if (pos / interleave) % world == rank {
                let vo = pos % virtual_block;
                row_block(row, pos / virtual_block, "build_batch")? * bs as i64
                    + ((vo / (world * interleave)) * interleave + vo % interleave) as i64
            } else {
                -1
            };
            slots.push(slot);
        }
    }
    while slots.len() < num_padded {
        slots.push(-1);
    }
    Ok((slots, positions, req_indices))
}

/// FlashInfer's `(kv_indptr, kv_indices, kv_last_page_len)` of the first `seq_lens.len()` rows.
pub fn flashinfer_csr(
    block_size: usize,
    tables: &[Vec<i64>],
    seq_lens: &[usize],
) -> Result<Triple, BatchError> {
    if tables.len() < seq_lens.len() {
        return Err(BatchError::Invalid(format!("{} block tables for {} sequences", tables.len(), seq_lens.len())));
    }
    let mut indptr = vec![0i64];
    let mut indices = Vec::new();
    let mut last = Vec::with_capacity(seq_lens.len());
    for (r, &len) in seq_lens.iter().enumerate() {
        let pages = len.div_ceil(block_size);
        let row = &tables[r];
        if row.len() < pages {
            return Err(BatchError::Invalid(format!(
                "flashinfer_csr: row {} has {} blocks, {} pages needed", r, row.len(), pages)));
        }
        indices.extend_from_slice(&row[..pages]);
        indptr.push(indptr.last().unwrap() + pages as i64);
        last.push(if pages == 0 { 0 } else { (len - (pages - 1) * block_size) as i64 });
    }
    Ok((indptr, indices, last))
}

/// SGLang's `req_to_token` rows: the flat slot of every position below each `seq_len`.
pub fn req_to_token(block_size: usize, tables: &[Vec<i64>], seq_lens: &[usize]) -> Result<Vec<Vec<i64>>, BatchError> {
    if tables.len() < seq_lens.len() {
        return Err(BatchError::Invalid(format!("{} block tables for {} sequences", tables.len(), seq_lens.len())));
    }
    let mut rows = Vec::with_capacity(seq_lens.len());
    for (r, &len) in seq_lens.iter().enumerate() {
        let row = &tables[r];
        let mut out = Vec::with_capacity(len);
        for pos in 0..len {
            out.push(row_block(row, pos / block_size, "req_to_token")? * block_size as i64 + (pos % block_size) as i64);
        }
        rows.push(out);
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_example_from_the_docs() {
        // docs/semantics.md, "Slot mapping": rows [7, 3, 9] and [5, 2], block size 4.
        let tables = vec![vec![7, 3, 9], vec![5, 2]];
        let ok = |r: Result<Triple, BatchError>| match r {
            Ok(v) => v,
            Err(_) => panic!("refused"),
        };
        // positions [0..5, 9] are not one contiguous run per request, so check a contiguous one.
        let (slots, pos, req) = ok(build_batch(4, &tables, &[0, 4], &[6, 3], 12, 1, 0, 1));
        assert_eq!(slots, vec![28, 29, 30, 31, 12, 13, 8, 9, 10, -1, -1, -1]);
        assert_eq!(pos, vec![0, 1, 2, 3, 4, 5, 4, 5, 6]);
        assert_eq!(req, vec![0, 0, 0, 0, 0, 0, 1, 1, 1]);
        let (slots, _, _) = ok(build_batch(4, &tables, &[0, 4], &[6, 3], 12, 2, 1, 1));
        assert_eq!(slots, vec![-1, 28, -1, 29, -1, 30, -1, 22, -1, -1, -1, -1]);
    }
}
