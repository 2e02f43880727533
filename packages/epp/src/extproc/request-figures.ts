// One ext_proc request's figures: its outcome (dynamo_epp_requests_total, and llm-d's request or error counter from
// the same call), whether it is running, and its response's timing, labelled as llm-d's router labels them.
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
  private streaming = false;
  private firstByteAt: number | undefined;
  private responseBytes = 0;
  private responded = false;

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

  /** The model its body names, and the one it runs as (a rewrite's target, else the same); unread: "". */
  models(model: string | undefined, target: string | undefined): void {
    this.model = model ? this.labels.models.label(model) : "";
    this.target = target ? this.labels.models.label(target) : this.model;
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

  /** The upstream's answer: other than 200 is a model server error; an event stream is a streamed response. */
  responseHeaders(status: string | undefined, contentType: string | undefined): void {
    this.streaming = contentType?.includes("text/event-stream") === true;
    if (status !== undefined && status !== "200" && !this.serverError) {
      this.serverError = true;
      this.failed("ModelServerError");
    }
  }

  responseBody(bytes: number, now = performance.now()): void {
    if (bytes > 0 && this.firstByteAt === undefined) this.firstByteAt = now;
    this.responseBytes += bytes;
  }

  /**
   * Its response is whole: how long it took, and, when it had a body, its TTFT, which for a response not streamed is
   * its end (the whole answer is its first token, as llm-d times it). Once.
   */
  responseEnded(now = performance.now()): void {
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
    return { model_name: this.model, target_model_name: this.target, fairness_id: this.fairnessId, priority: this.priority };
  }
}
