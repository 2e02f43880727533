// One ext_proc request's figures: its outcome (dynamo_epp_requests_total, and llm-d's request or error counter from
// the same call), whether it is running, and its response's timing and reported usage, labelled as llm-d's router
// labels them.
import type { ReportedUsage } from "@kv-epp/routing";
import type { Metrics, RequestOutcome } from "../metrics.ts";
import type { BoundedLabels } from "./gaie-headers.ts";

/** llm-d's error code for each way this EPP answers a request itself. */
const ERROR_CODE: Record<Exclude<RequestOutcome, "routed">, string> = {
  bad_request: "BadRequest",
  no_endpoint: "ServiceUnavailable",
  shed: "ResourceExhausted",
  error: "Internal",
};

/** The label values client input sets, bounded across the process's requests. */
export type ClientLabels = { fairness: BoundedLabels; models: BoundedLabels };

export class RequestFigures {
  private model = "";
  private target = "";
  private readonly fairnessId: string;
  private readonly priority: string;
  private running = false;
  private serverError = false;
  /** Its body asked for a streamed answer. */
  private streamAsked = false;
  /** Its response is an event stream. */
  private eventStream = false;
  private firstByteAt: number | undefined;
  /** The first byte came in the message that ended the response: no time passed between its tokens here. */
  private firstByteEnded = false;
  /** When the last non-empty body chunk came. */
  private lastChunkAt: number | undefined;
  private responseBytes = 0;
  private responded = false;
  /** Its request labels, built once its body named its models (body()). */
  private labelsOfRequest: Record<"model_name" | "target_model_name" | "fairness_id" | "priority", string> | undefined;
  /** Its inter-chunk latency series. */
  private itl: { observe(v: number): void } | undefined;

  /** `at`: when its headers came (performance.now()). */
  constructor(
    private readonly m: Metrics,
    private readonly labels: ClientLabels,
    cls: { fairnessId: string; priority: number },
    private readonly at = performance.now(),
  ) {
    this.fairnessId = labels.fairness.label(cls.fairnessId);
    this.priority = String(cls.priority);
  }

  /**
   * What its body says: the model it names, the one it runs as (a rewrite's target, else the same), unread: "";
   * and whether it asked for its answer streamed.
   */
  body(model: string | undefined, target: string | undefined, stream = false): void {
    this.model = model ? this.labels.models.label(model) : "";
    this.target = target ? this.labels.models.label(target) : this.model;
    this.labelsOfRequest = undefined;
    this.itl = undefined;
    this.streamAsked = stream;
  }

  /**
   * How it was answered (`bodyBytes`: of its body, read before the route); a routed request runs until end(). llm-d
   * does not count a request without a model as running.
   */
  outcome(outcome: RequestOutcome, bodyBytes = 0): void {
    this.m.requests.inc({ outcome });
    const l = this.m.llmd;
    if (outcome !== "routed") return this.failed(ERROR_CODE[outcome]);
    l.requests.inc(this.requestLabels());
    l.requestsDeprecated.inc({ ...this.modelLabels(), priority: this.priority });
    l.requestSize.observe(this.requestLabels(), bodyBytes);
    l.requestSizeDeprecated.observe(this.modelLabels(), bodyBytes);
    if (this.model === "") return;
    this.running = true;
    l.running.inc(this.requestLabels());
    l.runningDeprecated.inc({ model_name: this.model });
  }

  /** The upstream's answer: other than 200 is a model server error. */
  responseHeaders(status: string | undefined, contentType: string | undefined): void {
    this.eventStream = contentType?.includes("text/event-stream") === true;
    if (status !== undefined && status !== "200" && !this.serverError) {
      this.serverError = true;
      this.failed("ModelServerError");
    }
  }

  /**
   * A response body chunk (`ends`: its message ends the response). A streamed response's chunks after the first are
   * timed from the one before (llm-d's inter-token latency: between chunks as the data plane passes them on, each
   * of which may carry several tokens).
   */
  responseBody(bytes: number, ends = false, now = performance.now()): void {
    this.responseBytes += bytes;
    if (bytes === 0) return;
    if (this.firstByteAt === undefined) {
      this.firstByteAt = now;
      this.firstByteEnded = ends;
    }
    // Once per chunk, on the decision thread: the labels are checked once per response, not per chunk.
    if (this.streaming && this.lastChunkAt !== undefined) (this.itl ??= this.m.llmd.itl.labels(this.requestLabels())).observe((now - this.lastChunkAt) / 1000);
    this.lastChunkAt = now;
  }

  /**
   * Its response is whole: how long it took, and, when it had a body, its TTFT, which for a response not streamed is
   * its end (the whole answer is its first token, as llm-d times it); and the token counts its usage reported (a
   * stream's last usage: llm-d observes every usage a chunk carries, so a stream with vLLM's continuous usage counts
   * once per chunk there, once here). As llm-d, prompt and output counts of 0 are not observed, a cached count of 0
   * is. With its output count, the time per output token: normalized (the whole duration over every output token),
   * and for a streamed response whose first byte came before its end, the time after the first token over the
   * tokens after it. Once.
   */
  responseEnded(usage: ReportedUsage = {}, now = performance.now()): void {
    if (this.responded) return;
    this.responded = true;
    const l = this.m.llmd;
    const seconds = (now - this.at) / 1000;
    l.duration.observe(this.requestLabels(), seconds);
    l.durationDeprecated.observe(this.modelLabels(), seconds);
    l.responseSize.observe(this.requestLabels(), this.responseBytes);
    l.responseSizeDeprecated.observe(this.modelLabels(), this.responseBytes);
    const first = this.firstByteAt === undefined || this.streaming ? this.firstByteAt : now;
    if (first !== undefined) l.ttft.observe({ ...this.requestLabels(), streaming: String(this.streaming) }, (first - this.at) / 1000);
    const { promptTokens = 0, completionTokens = 0, cachedTokens } = usage;
    const counts = [
      [l.inputTokens, l.inputTokensDeprecated, promptTokens > 0 ? promptTokens : undefined],
      [l.outputTokens, l.outputTokensDeprecated, completionTokens > 0 ? completionTokens : undefined],
      [l.cachedTokens, l.cachedTokensDeprecated, cachedTokens],
    ] as const;
    for (const [current, twin, n] of counts) {
      if (n === undefined) continue;
      current.observe(this.requestLabels(), n);
      twin.observe(this.modelLabels(), n);
    }
    if (completionTokens === 0) return;
    l.ntpot.observe(this.requestLabels(), seconds / completionTokens);
    l.ntpotDeprecated.observe(this.modelLabels(), seconds / completionTokens);
    if (this.streaming && first !== undefined && !this.firstByteEnded && completionTokens > 1)
      l.tpot.observe(this.requestLabels(), (now - first) / 1000 / (completionTokens - 1));
  }

  /**
   * Its response is streamed when its body asked for a stream or the response is an event stream, as llm-d decides
   * (the request's `stream`, then the content type, which can only set it).
   */
  private get streaming(): boolean {
    return this.streamAsked || this.eventStream;
  }

  /** The request is over (answered, its response ended, or its stream broke): it no longer runs. */
  end(): void {
    if (!this.running) return;
    this.running = false;
    this.m.llmd.running.dec(this.requestLabels());
    this.m.llmd.runningDeprecated.dec({ model_name: this.model });
  }

  private failed(code: string): void {
    this.m.llmd.errors.inc({ ...this.requestLabels(), error_code: code });
    this.m.llmd.errorsDeprecated.inc({ ...this.modelLabels(), error_code: code });
  }

  private modelLabels() {
    return { model_name: this.model, target_model_name: this.target };
  }

  private requestLabels() {
    return (this.labelsOfRequest ??= { model_name: this.model, target_model_name: this.target, fairness_id: this.fairnessId, priority: this.priority });
  }
}
