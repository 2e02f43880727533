// Bench subscriber (Node child, libzmq + msgpackr): receives, checks seq, decodes each batch to
// the same typed events our decoder produces (u64 hashes as BigInt), counts block events.
const zmq = require("zeromq");
const { Unpackr } = require("msgpackr");
const [endpoint, warmArg, totalArg] = process.argv.slice(2);
const warm = Number(warmArg), total = Number(totalArg);
const unpackr = new Unpackr({ int64AsType: "bigint", useRecords: false, mapsAsObjects: true });
const toHash = (v) => (typeof v === "bigint" ? BigInt.asUintN(64, v) : typeof v === "number" ? BigInt.asUintN(64, BigInt(v)) : undefined);

function decode(payload) {
  const root = unpackr.unpack(payload);
  const events = [];
  for (const raw of root[1]) {
    // Today's vLLM sends tagged maps; read them positionally like the older array form.
    const e = Array.isArray(raw) ? raw : raw.type === "BlockRemoved" ? [raw.type, raw.block_hashes, raw.medium] : [raw.type, raw.block_hashes, raw.parent_block_hash, raw.token_ids, raw.block_size, raw.lora_id, raw.medium];
    if (e[0] === "BlockStored") {
      const hashes = e[1].map(toHash);
      events.push({ type: "BlockStored", blockHashes: hashes, parentBlockHash: e[2] == null ? null : toHash(e[2]), tokenIds: e[3], blockSize: e[4], loraId: e[5] ?? null, medium: e[6] ?? null });
    } else if (e[0] === "BlockRemoved") events.push({ type: "BlockRemoved", blockHashes: e[1].map(toHash), medium: e[2] ?? null });
    else if (e[0] === "AllBlocksCleared") events.push({ type: "AllBlocksCleared" });
  }
  return { ts: root[0], events, dataParallelRank: root[2] ?? null };
}

(async () => {
  const sub = new zmq.Subscriber({ receiveHighWaterMark: 100000 });
  sub.connect(endpoint);
  sub.subscribe("kv");
  let n = 0, blocks = 0, next = -1n, gaps = 0, t0 = 0, c0 = process.cpuUsage();
  for await (const [, seqB, payload] of sub) {
    const seq = seqB.readBigUInt64BE(0);
    if (next >= 0n && seq !== next) gaps++;
    next = seq + 1n;
    const b = decode(payload);
    n++;
    if (n === warm) {
      t0 = performance.now();
      c0 = process.cpuUsage();
    }
    if (n > warm) for (const e of b.events) if (e.type === "BlockStored") blocks += e.blockHashes.length;
    if (n === warm + total) {
      const ms = performance.now() - t0;
      const c = process.cpuUsage(c0);
      console.log(JSON.stringify({ ms, cpuMs: (c.user + c.system) / 1000, messages: total, blocks, gaps }));
      process.exit(0);
    }
  }
})();
