// The EPP's options, one entry each (schema with its default, help, section), in the order --help and
// the README list them. Routing's own come from @kv-epp/routing. Names follow from the key: the flag in
// kebab-case, DYN_EPP_ + SNAKE_CASE, the config file's key itself; `env` only where a deployed name
// predates that rule.
import { DEFAULT_KV_MAX_MESSAGE_SIZE, LISTENER_HEARTBEAT } from "@kv-epp/kv-events";
import { count, group, jsonObjectText, opt, port, positive, type Program } from "@kv-epp/options";
import { ROUTING_OPTIONS } from "@kv-epp/routing";
import {
  CHAT_ENGINES, CONTENT_FORMAT_OPTIONS, DEFAULT_CACHE_MAX_BYTES, DEFAULT_DISABLED_THINKING, DEFAULT_INLINE_SYSTEM, DEFAULT_MEMBER_NICE, DEFAULT_RESPONSE_ROLE,
  DEFAULT_TOKENIZER_MODE, DISABLED_THINKING_OPTIONS, INLINE_SYSTEM_OPTIONS,
} from "@kv-epp/tokenizer";
import { z } from "zod";

export const EPP_PROGRAM = { envPrefix: "DYN_EPP_" } as const satisfies Program;

/** The replica-agg port, and a static peer's when it names none (docs/CONTRACTS.md §11). */
export const DEFAULT_REPLICA_AGG_PORT = 9092;
/**
 * The decision warm-up's picks. Fresh EPPs sent 3 bursts of 12 of the trace's chats right after Ready (bench:pick's
 * cold start, six runs each, idle machine): the first burst's mean pick inside the EPP 14.6 ms after 500 picks,
 * 15.2 ms after 100, 21.0 after 50, 26.1 with none (three runs), the later bursts alike from 25 up; 100 cost ~0.45 s of the
 * start where 500 cost ~1.3 s, CPU a replica started beside serving ones takes from them.
 */
export const DEFAULT_WARM_UP_PICKS = 100;

/**
 * The decision thread's and the tokenizer threads' time slice, µs: the kernel's shortest. Each wakes for a message, works
 * well under a millisecond and sleeps; with the kernel's default slice a woken one waited behind a thread still in its
 * slice (a member's long text, the generator, the JIT), which slow picks logged as their handoff. Measured in bench:pick
 * (see packages/epp/README.md, "Scheduler slice").
 */
export const DEFAULT_THREAD_SLICE_US = 100;

const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const;
/** ext_proc body send modes by flag value (extproc/assumed-modes.ts maps them to the protocol's). */
export const BODY_MODES = ["auto", "none", "streamed", "buffered", "buffered-partial", "full-duplex"] as const;

export const EPP_OPTIONS = {
  ...group("Configuration", {
    config: opt.string(z.string().min(1).optional(), "static config file (YAML/JSON): workers, peers, and any option of this list by its camelCase key"),
    logLevel: opt.choice(LOG_LEVELS, "info", "pino level"),
  }),
  ...group("Workers (Kubernetes mode; the config file's workers replace them)", {
    poolName: opt.string(z.string().min(1).optional(), "InferencePool name (Kubernetes mode)"),
    poolNamespace: opt.string(z.string().min(1).default("default"), "namespace of the pool and peers", { env: "POD_NAMESPACE" }),
    model: opt.string(z.string().min(1).default("default"), "model name"),
    tenant: opt.string(z.string().min(1).default("default"), "tenant of the indexer key"),
    loraAdapters: opt.list(z.array(z.string().min(1)).default([]), "LoRA adapter names served by the model, comma-separated (more are learned from events' lora_name)"),
    blockSize: opt.int(positive.default(16), "KV block size in tokens"),
    dpSize: opt.int(positive.default(1), "data-parallel ranks per worker (Kubernetes mode)"),
    kvEventsPort: opt.int(port.default(5557), "workers' KV event port (rank r: +r)"),
    kvReplayPort: opt.int(port.optional(), "workers' KV replay port (rank r: +r)"),
    scrapeIntervalMs: opt.int(count.default(1000), "vLLM /metrics scrape period (0: off)"),
  }),
  ...group("KV events and the index", {
    kvTopic: opt.string(z.string().default(""), "KV event topic"),
    kvHeartbeatMs: opt.int(count.default(LISTENER_HEARTBEAT.intervalMs), "ZMTP PING to a KV publisher this often; dropped and redialed after 3 silent intervals (0: off)"),
    kvMaxMessageBytes: opt.int(
      count.default(DEFAULT_KV_MAX_MESSAGE_SIZE),
      "largest KV-event message read from a worker; a larger one closes that connection and is counted (the default holds a 1M-token step of a hybrid model, see the kv-events README)",
    ),
    intentDiscovery: opt.string(z.string().min(1).optional(), "attach workers' KV intents: kubernetes | http://HOST:PORT (off when unset)"),
    kvHost: opt.string(z.string().min(1).default("dynamo-epp"), "host instance workers address their intents to"),
    indexReserve: opt.bool(
      z.boolean().default(true),
      "size the index's tables for the ranks' scraped num_gpu_blocks (summed) as they report it, so filling caches never stops ingestion for a table rebuild",
    ),
    maxBlocksPerRank: opt.int(count.default(1_048_576), "blocks a worker rank may hold in the index when its num_gpu_blocks is not known (0: no bound)"),
  }),
  ...group("Servers", {
    listen: opt.string(z.string().min(1).default("0.0.0.0"), "address every server binds"),
    grpcPort: opt.int(port.default(9002), "ext_proc gRPC port"),
    grpcHealthPort: opt.int(port.default(9003), "grpc-health port"),
    healthChecking: opt.bool(z.boolean().default(false), "also serve grpc.health.v1.Health Check and List on the ext_proc port (as GAIE's --health-checking)"),
    metricsPort: opt.int(port.default(9090), "Prometheus port"),
    selectionPort: opt.int(port.default(9093), "selection-http port"),
    secureServing: opt.bool(z.boolean().default(true), "TLS (ALPN h2) on the ext_proc port; false: h2c", { env: "DYN_SECURE_SERVING" }),
    tlsCertFile: opt.string(z.string().min(1).optional(), "PEM certificate, reloaded when it changes (unset: a self-signed one)"),
    tlsKeyFile: opt.string(z.string().min(1).optional(), "PEM private key of --tls-cert-file"),
    bodyMode: opt.choice(
      BODY_MODES,
      "auto",
      "the ext_proc filter's processing_mode.request_body_mode, used only for streams whose first message carries no protocol_config (Envoy before 1.34, its observability mode, other data planes): a protocol_config always wins. auto: full-duplex, the one mode GAIE's endpoint picker serves; a filter in another mode must be named, or its requests wait for their route until Envoy's message_timeout (warned once)",
    ),
    responseBodyMode: opt.choice(
      BODY_MODES,
      "auto",
      "the filter's processing_mode.response_body_mode, for streams without protocol_config as --body-mode: full-duplex response chunks are answered with streamed_response, the other modes' with CONTINUE (or the chunk replaced), and Envoy refuses either in the other's mode (500); none: no response body comes, the load is held to the stream's end. auto: full-duplex when the request's mode is full-duplex, else buffered (CONTINUE answers, right for none, streamed, buffered and buffered-partial alike; the reply's first token is then not timed)",
    ),
    shutdownDelayMs: opt.int(count.default(0), "on SIGTERM, keep serving this long after NOT_SERVING before draining"),
  }),
  ...group("Requests", {
    explain: opt.bool(z.boolean().default(false), "explain every decision in an x-kv-epp-decision header (else only requests sending x-kv-epp-explain: 1)"),
    fallbackEndpoints: opt.int(count.default(0), "also name this many next-best distinct endpoints after the pick, for the gateway's retries"),
    emitEndpointScores: opt.bool(z.boolean().default(false), "also send each scored endpoint's score (the negated cost of its best rank: higher is better) in the route's envoy.lb metadata, x-gateway-destination-endpoint-scores (as llm-d's --emit-endpoint-scores)"),
    objectivePriorities: opt.string(
      z.string().default(""),
      "InferenceObjective priorities, name=priority,... (x-llm-d-inference-objective or x-gateway-inference-objective; < 0: sheddable); in Kubernetes mode the pool's InferenceObjective resources win, these give the names they do not",
    ),
    maxInflight: opt.int(count.default(0), "shed (429) above this many in-flight requests (0: off)"),
    warmUpPicks: opt.int(
      count.default(DEFAULT_WARM_UP_PICKS),
      "before serving, run this many invented chats and completions through the replica's own decision path (a loopback ext_proc server with its TLS, body mode and tokenizer, over a scratch index; nothing counted or kept), so that its first real picks run compiled code (at most 5 s; 0: off)",
    ),
    slowPickMs: opt.int(count.default(20), "log an ext_proc pick (complete body -> decision) this slow with where its time went: reading and tokenizing (queued for a pool member, the member's work, the handoff there and back), the decision (at most one line per outcome per 10 s; 0: off)"),
    extProcBufferMaxBytes: opt.int(
      positive.optional(),
      "request-body bytes all ext_proc streams together may hold while their route is not known; a body that would pass it is routed by load on what has come, the rest passed through unbuffered. Parts of gRPC messages still arriving are bounded by it too, on their own: past it, a stream's call fails with RESOURCE_EXHAUSTED, the oldest message's excepted (default: an eighth of the cgroup memory limit, else of host memory)",
    ),
    conformanceTestHooks: opt.bool(
      z.boolean().default(false),
      "GAIE conformance suite hooks: a request's test-epp-endpoint-selection header picks its candidates, responses echo the served and selected endpoints (x-conformance-test-*); test clusters only, any client could steer its requests",
    ),
  }),
  ...group("Tokenizer", {
    tokenizerDir: opt.string(z.string().min(1).optional(), "tokenizer.json directory"),
    chatRendering: opt.choice(
      CHAT_ENGINES,
      "vllm",
      "the workers' engine, whose OpenAI server's rules chats are read and rendered by: vllm or sglang (tools, content parts, a final assistant turn and reasoning effort render differently, and a chat rendered by the other's rules hashes to blocks the workers never stored); the chat flags below are vLLM's, and sglang reads only --default-chat-template-kwargs, --chat-template and --model-path. Under sglang a request's LoRA adapter is SGLang's (a model \"<model>:<adapter>\", else the body's lora_path), and a body with an extra_key (a cache namespace no KV event names) is routed by load",
    ),
    defaultChatTemplateKwargs: opt.string(
      jsonObjectText.optional(),
      "the workers' --default-chat-template-kwargs (vLLM's or SGLang's), a JSON object (e.g. {\"enable_thinking\": false}): chats render with these unless the request sets them, as on the workers (a template that prints them, such as a reasoning effort in the system prompt, otherwise differs from the first block on); under sglang a reasoning_effort among them is the request's when it sets none",
    ),
    excludeToolsWhenToolChoiceNone: opt.bool(
      z.boolean().default(false),
      "the workers' vLLM --exclude-tools-when-tool-choice-none: a chat whose tool_choice is \"none\" renders without its tools, as on the workers",
    ),
    chatTemplate: opt.string(
      z.string().min(1).optional(),
      "the workers' --chat-template, rendering every chat in place of the tokenizer's templates, as on the workers: under vllm a file's path, or the template itself (a value that opens as no file and holds {, } or a newline); under sglang a .jinja file, read as SGLang reads it (outer newlines stripped, a literal \\n a newline), and any other value names one of SGLang's own conversation templates, which is not mirrored: every chat is routed by load (unrendered, cause template_engine; warned at startup)",
    ),
    modelPath: opt.string(
      z.string().min(1).optional(),
      "the workers' SGLang --model-path (default: --model, as SGLang's served model name defaults to its model path). Under sglang without --chat-template, SGLang renders a model whose path it recognizes (InternVL, Janus, Vicuna and LLaVA-1.5/1.6/OneVision, DeepSeek-VL2 and -OCR, MiniCPM-V/o, Phi-4-multimodal, POINTS, PaddleOCR, Whisper; or a config.json under the path naming such a model_type) with one of its own conversation templates, which is not mirrored: every chat is routed by load (unrendered, cause template_engine; warned at startup). Set it when --served-model-name differs from the path: by default a served name such as \"whisper-chat\" counts as the path, and a relative one is looked up for config.json under the EPP's working directory",
    ),
    chatTemplateContentFormat: opt.choice(
      CONTENT_FORMAT_OPTIONS,
      "auto",
      "the workers' vLLM --chat-template-content-format: string or openai hands every message's content to the template in that shape; auto detects it on the template, as on the workers",
    ),
    trustRequestChatTemplate: opt.bool(
      z.boolean().default(false),
      "the workers' vLLM --trust-request-chat-template: a request's own template (chat_template, or chat_template_kwargs' chat_template) renders it; without it such a request is refused (400), as the workers refuse it",
    ),
    responseRole: opt.string(
      z.string().min(1).default(DEFAULT_RESPONSE_ROLE),
      "the workers' vLLM --response-role: the role of a reply to a chat with a generation prompt, which its next turn sends back (a reply's warmed next turn renders it in that role) and which decides whether echo repeats the final message, as on the workers",
    ),
    tokenizerMode: opt.string(
      z.string().min(1).default(DEFAULT_TOKENIZER_MODE),
      "the workers' vLLM --tokenizer-mode: auto, hf and slow render chats with the tokenizer's Jinja template, as mirrored here; any other mode (mistral, deepseek_v32, grok2, ...) renders them in vLLM's own code, which is not mirrored: every chat is routed by load (unrendered, cause template_engine; warned at startup). Under auto, as vLLM's, a model whose config.json names model_type gpt_oss (Harmony), an architecture given its own mode (Grok1ForCausalLM, DeepseekV32ForCausalLM, DeepseekV4ForCausalLM, MoonshotKimiaForCausalLM, ... as the tokenizer README lists) or a tokenizer directory holding tekken.json or tokenizer.model.v* anywhere under it (Mistral's) is routed by load too; gpt_oss whatever the mode",
    ),
    anthropicInlineSystem: opt.choice(
      INLINE_SYSTEM_OPTIONS,
      DEFAULT_INLINE_SYSTEM,
      "where the workers' vLLM puts the system messages a /v1/messages body has among its messages (Claude Code appends one most turns), as their Anthropic server is set to: those that open the messages always join the system prompt; preserve keeps the others in place as system turns (folding them when the body has no system prompt at all), fold merges each into the user message beside it; auto, vLLM's default, probes the served template at startup as vLLM does (preserve where an inline system message renders as a turn of its own, else fold)",
    ),
    anthropicDisabledThinkingEffort: opt.choice(
      DISABLED_THINKING_OPTIONS,
      DEFAULT_DISABLED_THINKING,
      "the reasoning_effort the workers' vLLM gives a /v1/messages body with thinking {type: disabled} (over its output_config.effort), as their Anthropic server is set to; templates read it and the enable_thinking it sets (false only for none), so it changes the prompt; auto, vLLM's default, probes the served template at startup as vLLM does (none where the template renders none unlike every other effort, else low)",
    ),
    tokenizerThreads: opt.int(
      count.optional(),
      "worker threads that render and tokenize off the decision thread (default: under a cgroup CPU quota its CPUs less one for the decision thread, at least 1 (members filling the quota get the whole cgroup throttled, the decision thread with it, for the rest of each CFS period); without a quota, the process's CPUs; at most 8 either way, each member holding ~25 MB beside the tokenizer model all share; 0: on the event loop). The start-up log 'tokenizer pool warmed up' says what set the size (sizedBy: quota, cpus, max_default_members or --tokenizer-threads); a value above that CPU limit is warned of",
    ),
    tokenizerNice: opt.int(
      z.number().int().min(0).max(19).default(DEFAULT_MEMBER_NICE),
      "nice value of the tokenizer threads (0-19, Linux; 0: the decision thread's). Above 0 a machine running nothing else runs the decision thread first; under a pod's cgroup or a session's autogroup it also hands the threads' cores to other groups' work, and picks wait for their tokens",
    ),
    threadSliceUs: opt.int(
      z.number().int().refine((us) => us === 0 || (us >= 100 && us <= 100_000), "0, or 100-100000 (the kernel's bounds)").default(DEFAULT_THREAD_SLICE_US),
      "time slice, µs, that the decision thread and the tokenizer threads ask the kernel for (Linux 6.12+, EEVDF; 0: the kernel's default, 1.4 ms on 2 CPUs under Linux 6.18): a thread woken by a message then preempts a busier thread instead of waiting out its slice, its share of the CPU unchanged. On older kernels nothing changes (logged at start-up)",
    ),
    tokenizerCacheBytes: opt.int(
      count.default(DEFAULT_CACHE_MAX_BYTES),
      "bound of the segment cache (pieces of rendered prompts -> their token ids) for the whole process, each tokenizer thread a share; 0: none (every prompt is tokenized fresh as far as its pick needs, replies are not warmed, and a pick over the budget stops its tokenization). Size it for the distinct prompt text a replica sees between a conversation's turns: one preprocessor given the trace's first 2000 chats spent 1.3 ms a request at 64 MiB (most pieces evicted before their reuse), 0.9 ms at 1 GiB (~250 MiB used), 1.1 ms without a cache",
    ),
    tokenizeBudgetMs: opt.int(count.default(50), "a pick whose tokenization would take longer is routed on the prefix already known (Envoy's message_timeout is 200 ms)"),
    routeOnSettledPrefix: opt.bool(z.boolean().default(true), "route a long text once its known prefix settles the pick: it holds a block no worker or in-flight request has, or the one worker holding all of it is chosen outright (the rest cannot change the pick and is not tokenized; the request is charged for its estimated length)"),
  }),
  ...ROUTING_OPTIONS,
  ...group("Replica-agg (in-flight load shared with peer replicas)", {
    replicaAgg: opt.bool(z.boolean().default(true), "share in-flight load with peer replicas"),
    replicaAggPort: opt.int(port.default(DEFAULT_REPLICA_AGG_PORT), "replica-agg port (and static peers' when they name none)"),
    replicaAggHeartbeatMs: opt.int(positive.default(1000), "period of replica-agg snapshots (heartbeats)"),
    replicaAggTimeoutMs: opt.int(positive.default(3000), "drop a peer's load after this long without a snapshot (more than the heartbeat)"),
  }),
  ...group("Recovery (the index from a peer's /dump at start)", {
    peerService: opt.string(z.string().min(1).optional(), "peer Service (EndpointSlices) for recovery and replica-agg"),
    peerToken: opt.string(z.string().min(1).optional(), "bearer token for /dump"),
    podIp: opt.string(z.string().min(1).optional(), "this replica's own IP (excluded from peers)", { env: "POD_IP" }),
    subscribeWaitMs: opt.int(count.default(5000), "before recovery, wait this long at most for KV listeners to connect"),
    recoveryTimeoutMs: opt.int(count.default(30000), "dump no-progress timeout", { env: "DYN_EPP_RECOVERY_HTTP_TIMEOUT_MS" }),
    recoveryBudgetMib: opt.int(count.optional(), "most a dump may stage, MiB (default: half the cgroup memory limit, else of host memory)"),
    recoveryMinRateBytes: opt.int(count.default(65536), "a dump body slower than this many bytes/s over a window fails (0: off)"),
    recoveryRateWindowMs: opt.int(count.default(10000), "window of the dump rate floor"),
    recoveryPeerMaxFailures: opt.int(count.default(3), "set a peer aside after this many failed dumps in a row (0: never)"),
    recoveryDeadlineMs: opt.int(count.default(0), "give up recovery after this long and start with an EMPTY index (0: wait for a peer)"),
  }),
};
