// Worker-side batch metadata (capability batch_metadata): one step's slot mapping, positions
// and request indices, FlashInfer's CSR page table and SGLang's req_to_token rows, from block
// tables passed in (kvcheck.conformance.protocol.SupportsBatchMetadata).
import { EngineError } from "./manager.mjs";

const PAD_SLOT_ID = -1;

function blockAt(row, index, r) {
  if (index >= row.length) {
    throw new EngineError("internal", `row ${r} has ${row.length} blocks, position needs block ${index}`);
  }
  return row[index];
}

export function buildBatch(blockSize, tables, computed, scheduled, padded, world, rank, interleave) {
  const W = world ?? 1;
  const I = interleave ?? 1;
  if (!(W >= 1) || !(rank >= 0 && rank < W)) {
    throw new EngineError("not_supported", `dcp_world_size ${W}, dcp_rank ${rank}`);
  }
  if (!(I >= 1) || blockSize % I !== 0) {
    throw new EngineError("not_supported", `cp_kv_cache_interleave_size ${I} does not divide block_size ${blockSize}`);
  }
  const slots = [];
  const positions = [];
  const reqIndices = [];
  const V = blockSize * W;
  for (let r = 0; r < scheduled.length; r++) {
    const row = tables[r];
    for (let j = 0; j < scheduled[r]; j++) {
      const pos = computed[r] + j;
      positions.push(pos);
      reqIndices.push(r);
      if (W === 1) {
        slots.push(blockAt(row, Math.floor(pos / blockSize), r) * blockSize + (pos % blockSize));
      } else {
        const vo = pos % V;
        if (Math.floor(vo / I) % W === rank) {
          slots.push(blockAt(row, Math.floor(pos / V), r) * blockSize + Math.floor(vo / (W * I)) * I + (vo % I));
        } else {
          slots.push(PAD_SLOT_ID);
        }
      }
    }
  }
  if (padded < slots.length) {
    throw new EngineError("internal", `num_padded_tokens ${padded} < the ${slots.length} scheduled tokens`);
  }
  while (slots.length < padded) slots.push(PAD_SLOT_ID);
  return [slots, positions, reqIndices];
}

export function flashinferCsr(blockSize, tables, seqLens) {
  const indptr = [0];
  const indices = [];
  const lastPageLen = [];
  for (let r = 0; r < seqLens.length; r++) {
    const pages = Math.floor((seqLens[r] + blockSize - 1) / blockSize);
    for (let p = 0; p < pages; p++) indices.push(blockAt(tables[r], p, r));
    indptr.push(indices.length);
    lastPageLen.push(seqLens[r] - (pages - 1) * blockSize);
  }
  return [indptr, indices, lastPageLen];
}

export function reqToToken(blockSize, tables, seqLens) {
  const rows = [];
  for (let r = 0; r < seqLens.length; r++) {
    const row = [];
    for (let pos = 0; pos < seqLens[r]; pos++) {
      row.push(blockAt(tables[r], Math.floor(pos / blockSize), r) * blockSize + (pos % blockSize));
    }
    rows.push(row);
  }
  return rows;
}
