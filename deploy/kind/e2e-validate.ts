// The validation scenario of the kind e2e (steps 1-5 of the cluster-sim scenario, plus 6: the workers' attachment
// intents), run by e2e.sh once the manifests are applied. Everything goes through kubectl: pod state from `get -o json`, logs from `logs`, and the
// EPPs' own endpoints (metrics, /dump, /select) from inside the EPP pods with `exec ... bun -e`,
// so the script needs no port-forward and works under the NetworkPolicy overlay too.
// Exits 1 at the first failed step. Uses only Bun and kubectl (deploy/ has no dependencies).

export {};

const NS = process.env.E2E_NAMESPACE ?? "kv-epp";
const MODEL = process.env.E2E_MODEL ?? "Qwen/Qwen3-0.6B";
const EPP = "app.kubernetes.io/name=dynamo-epp";
const WORKERS = process.env.E2E_WORKERS ?? "app=vllm"; // the InferencePool's selector
const KV_HOST = "dynamo-epp"; // DYN_EPP_KV_HOST / MOCK_WORKER_KV_HOST in deploy/base
const WAIT_MS = Number(process.env.E2E_WAIT_MS ?? 180_000);

type Pod = { name: string; uid: string; ip: string; ready: boolean; terminating: boolean };

class StepFailed extends Error {}

function kubectl(args: string[], allowFail = false): string {
  const r = Bun.spawnSync(["kubectl", "-n", NS, ...args], { stdout: "pipe", stderr: "pipe" });
  if (r.exitCode !== 0 && !allowFail) throw new StepFailed(`kubectl ${args.join(" ")}: ${r.stderr.toString().trim()}`);
  return r.stdout.toString();
}

function podsOf(selector: string): Pod[] {
  const list = JSON.parse(kubectl(["get", "pods", "-l", selector, "-o", "json"])) as {
    items: { metadata: { name: string; uid: string; deletionTimestamp?: string }; status: { podIP?: string; conditions?: { type: string; status: string }[] } }[];
  };
  return list.items.map((p) => ({
    name: p.metadata.name,
    uid: p.metadata.uid,
    ip: p.status.podIP ?? "",
    ready: p.status.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false,
    terminating: p.metadata.deletionTimestamp !== undefined,
  }));
}

const eppPods = () => podsOf(EPP);
const serving = () => eppPods().filter((p) => p.ready && !p.terminating);
const readyWorkers = () => podsOf(WORKERS).filter((p) => p.ready && !p.terminating);

type Lease = { metadata: { name: string; labels?: Record<string, string>; annotations?: Record<string, string>; ownerReferences?: { kind: string; name: string; uid: string }[] } };

/** The attachment-intent Leases (deploy/README.md): worker, rank and owning pod of each. */
function intentLeases(): { name: string; workerId: string; dpRank: number; owners: string[] }[] {
  const list = JSON.parse(kubectl(["get", "leases", "-l", "kv-epp.dev/record=attachment-intent", "-o", "json"])) as { items: Lease[] };
  return list.items.map((l) => {
    const payload = JSON.parse(l.metadata.annotations?.["kv-epp.dev/payload"] ?? "{}") as { workerId?: string; dpRank?: number };
    return { name: l.metadata.name, workerId: payload.workerId ?? "", dpRank: payload.dpRank ?? -1, owners: (l.metadata.ownerReferences ?? []).map((o) => o.uid) };
  });
}

/** The worker ids an EPP has listeners for (its /workers), one entry per rank. */
function eppWorkerIds(pod: string): string[] {
  const text = inPod(pod, `console.log(JSON.stringify(await (await fetch("http://127.0.0.1:9093/workers")).json()));`);
  return (JSON.parse(text) as { worker_id: string }[]).map((w) => w.worker_id).sort();
}

/**
 * Waits until every ready worker pod has its intent Leases (owned by it, worker id = pod name) and
 * every serving EPP lists exactly those workers, one entry per rank: pod discovery and the intents
 * merged into one worker each.
 */
async function intentsLive(what: string): Promise<Pod[]> {
  return waitFor(what, () => {
    const workers = readyWorkers();
    const leases = intentLeases();
    const ranks: string[] = [];
    for (const w of workers) {
      const own = leases.filter((l) => l.workerId === w.name && l.owners.includes(w.uid));
      if (own.length === 0) return undefined;
      ranks.push(...own.map(() => w.name));
    }
    ranks.sort();
    return serving().every((e) => JSON.stringify(eppWorkerIds(e.name)) === JSON.stringify(ranks)) ? workers : undefined;
  });
}

async function waitFor<T>(what: string, fn: () => T | undefined | false, timeoutMs = WAIT_MS): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    try {
      const v = fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new StepFailed(`timed out waiting for ${what}${last instanceof Error ? ` (${last.message})` : ""}`);
    await Bun.sleep(1000);
  }
}

/** Runs JavaScript inside an EPP pod (the image has Bun) and returns what it printed. */
function inPod(pod: string, code: string): string {
  return kubectl(["exec", pod, "-c", "epp", "--", "bun", "-e", `(async () => { ${code} })().catch((e) => { console.error(e); process.exit(1); })`]);
}

function recoveryState(pod: string): string {
  const text = inPod(pod, `console.log(await (await fetch("http://127.0.0.1:9090/metrics")).text());`);
  const m = /^dynamo_epp_kv_recovery_state\{state="(\w+)"\} 1(?:\.0)?$/m.exec(text);
  if (!m) throw new StepFailed(`${pod}: no recovery state set to 1 in /metrics`);
  return m[1]!;
}

/**
 * The pod's /dump as a sorted list of event contents (event ids left out: replicas number their
 * events independently). u64 values are kept as strings so no precision is lost.
 */
function dumpOf(pod: string): string[] {
  const text = inPod(pod, `const r = await fetch("http://127.0.0.1:9093/dump"); if (!r.ok) throw new Error("dump " + r.status); process.stdout.write(await r.text());`);
  const exact = text.replace(/([:[,]\s*)(\d{16,})(?=\s*[,\]}])/g, '$1"$2"');
  const dump = JSON.parse(exact) as Record<string, { block_size: number; events: { worker_id: string; dp_rank: number; event: { data: unknown } }[] }>;
  const out: string[] = [];
  for (const [key, v] of Object.entries(dump)) {
    for (const e of v.events) out.push(JSON.stringify([key, v.block_size, e.worker_id, e.dp_rank, e.event.data]));
  }
  return out.sort();
}

const sameDump = (a: string[], b: string[]) => a.length === b.length && a.every((x, i) => x === b[i]);

function firstLine(lines: string[], re: RegExp): number {
  return lines.findIndex((l) => re.test(l));
}

/** Requests as a gateway would route them: ask an EPP (/select), send the completion to its pick. */
function traffic(from: string, epps: Pod[], requests: number): void {
  const code = `
    const epps = ${JSON.stringify(epps.map((p) => p.ip))};
    const model = ${JSON.stringify(MODEL)};
    const post = async (url, body) => {
      const r = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
      if (!r.ok) throw new Error(url + " " + r.status + " " + (await r.text()));
      return r.json();
    };
    for (let i = 0; i < ${requests}; i++) {
      const prompt = "Shared system prompt " + (i % 8) + ". " + "The quick brown fox jumps over the lazy dog. ".repeat(24) + "Question " + i + "?";
      const pick = await post("http://" + epps[i % epps.length] + ":9093/select", { model, prompt });
      await post("http://" + pick.endpoint + "/v1/completions", { model, prompt, max_tokens: 8 });
    }
    console.log("sent ${requests}");`;
  inPod(from, code);
}

async function step1(): Promise<void> {
  kubectl(["rollout", "status", "deploy/vllm-mock", `--timeout=${WAIT_MS / 1000}s`], true);
  kubectl(["rollout", "status", "deploy/dynamo-epp", `--timeout=${WAIT_MS / 1000}s`]);
  const pods = await waitFor("two ready EPP replicas", () => (serving().length === 2 ? serving() : undefined));
  for (const p of pods) {
    const state = recoveryState(p.name);
    if (state !== "empty_bootstrap") throw new StepFailed(`${p.name} reports ${state}, expected empty_bootstrap`);
  }
  // Traffic waits for the workers' intents (they retry until the EPPs advertise the KV host).
  await intentsLive("the workers' attachment intents, attached by both EPPs");
}

async function step2(): Promise<void> {
  const pods = serving();
  traffic(pods[0]!.name, pods, 64);
  await waitFor("both EPP indexes to agree and be non-empty", () => {
    const [a, b] = pods.map((p) => dumpOf(p.name));
    return a!.length > 0 && sameDump(a!, b!);
  }, 60_000);
}

async function step3(): Promise<void> {
  const [victim, survivor] = serving();
  kubectl(["delete", "pod", victim!.name, "--wait=false"]);
  const fresh = await waitFor("a replacement replica to become ready", () =>
    serving().find((p) => p.name !== victim!.name && p.name !== survivor!.name),
  );
  const lines = kubectl(["logs", fresh.name, "-c", "epp"]).split("\n");
  const subscribed = firstLine(lines, /subscribed/);
  const recovered = firstLine(lines, /recovered\b.*\bfrom peer/);
  if (subscribed < 0 || recovered < 0 || subscribed > recovered) {
    throw new StepFailed(`${fresh.name}: expected "subscribed" (line ${subscribed}) before "recovered from peer" (line ${recovered})`);
  }
  const state = recoveryState(fresh.name);
  if (state !== "recovered") throw new StepFailed(`${fresh.name} reports ${state}, expected recovered`);
  await waitFor(`${fresh.name}'s dump to equal ${survivor!.name}'s`, () => sameDump(dumpOf(fresh.name), dumpOf(survivor!.name)), 30_000);
}

async function step4(): Promise<void> {
  const before = dumpOf(serving()[0]!.name);
  const oldNames = new Set(eppPods().map((p) => p.name));
  kubectl(["rollout", "restart", "deploy/dynamo-epp"]);
  let minReady = Number.POSITIVE_INFINITY;
  const done = await waitFor("the rollout to finish", () => {
    const pods = eppPods();
    minReady = Math.min(minReady, pods.filter((p) => p.ready && !p.terminating).length);
    const fresh = pods.filter((p) => !oldNames.has(p.name));
    return pods.length === 2 && fresh.length === 2 && fresh.every((p) => p.ready) ? fresh : undefined;
  });
  if (minReady < 1) throw new StepFailed("a moment with zero ready EPP replicas during the rollout");
  for (const p of done) {
    const state = recoveryState(p.name);
    if (state !== "recovered") throw new StepFailed(`${p.name} reports ${state} after the rollout, expected recovered`);
    if (!sameDump(dumpOf(p.name), before)) throw new StepFailed(`${p.name}'s index after the rollout differs from the one before it`);
  }
}

async function step5(): Promise<void> {
  const oldNames = new Set(eppPods().map((p) => p.name));
  kubectl(["delete", "pod", "-l", EPP, "--wait=false"]);
  const fresh = await waitFor("two new ready replicas", () => {
    const pods = serving().filter((p) => !oldNames.has(p.name));
    return pods.length === 2 ? pods : undefined;
  });
  for (const p of fresh) {
    const state = recoveryState(p.name);
    if (state !== "empty_bootstrap") throw new StepFailed(`${p.name} reports ${state}, expected empty_bootstrap`);
    if (!kubectl(["logs", p.name, "-c", "epp"]).includes("EMPTY KV index")) throw new StepFailed(`${p.name} did not log "EMPTY KV index"`);
  }
}

async function step6(): Promise<void> {
  const workers = await intentsLive("intents attached by the replicas of step 5");
  // One host record, shared by the replicas: owned by each serving one once the old ones are gone.
  await waitFor(`kvh-${KV_HOST} owned by exactly the serving replicas`, () => {
    const lease = JSON.parse(kubectl(["get", "lease", `kvh-${KV_HOST}`, "-o", "json"])) as Lease;
    const owners = (lease.metadata.ownerReferences ?? []).map((o) => o.uid).sort();
    return JSON.stringify(owners) === JSON.stringify(serving().map((p) => p.uid).sort());
  });
  const victim = workers[0]!;
  kubectl(["delete", "pod", victim.name, "--wait=true", `--timeout=${WAIT_MS / 1000}s`]);
  await waitFor(`${victim.name}'s intent Leases gone (withdrawn, or collected with the pod)`, () => !intentLeases().some((l) => l.owners.includes(victim.uid)));
  await waitFor(`every EPP to drop ${victim.name}`, () => serving().every((e) => !eppWorkerIds(e.name).includes(victim.name)));
  const after = await intentsLive("the replacement worker's intents attached");
  if (after.some((w) => w.name === victim.name)) throw new StepFailed(`${victim.name} is still listed after its deletion`);
}

const steps: [string, () => Promise<void>][] = [
  ["1 cold start: both replicas ready, both empty_bootstrap", step1],
  ["2 traffic fills the caches, both indexes agree", step2],
  ["3 a deleted replica's replacement recovers from its peer", step3],
  ["4 a rolling update keeps a ready replica and the index", step4],
  ["5 both deleted at once: empty_bootstrap again", step5],
  ["6 attachment intents: Leases owned by the workers, attached by the EPPs, gone with a deleted worker", step6],
];

for (const [name, run] of steps) {
  const t0 = Date.now();
  try {
    await run();
    console.log(`PASS step ${name} (${Math.round((Date.now() - t0) / 1000)} s)`);
  } catch (e) {
    console.log(`FAIL step ${name}: ${e instanceof Error ? e.message : String(e)}`);
    process.exit(1);
  }
}
console.log(`e2e: all ${steps.length} steps passed`);
