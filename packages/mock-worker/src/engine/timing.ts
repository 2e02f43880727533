/**
 * How long a simulated request takes. Pure arithmetic, so a trace benchmark can run it in simulated
 * time; the engine turns it into sleeps. All results are milliseconds already scaled by `speed`
 * (0 = instantaneous, 1 = the configured costs, 2 = twice as slow).
 */
export type TimingParams = {
  speed: number;
  /** Fixed cost of a prefill step. */
  prefillBaseMs: number;
  /** Cost per prompt token that is not served from the prefix cache. */
  prefillMsPerToken: number;
  /** Cost per output token with one request running. */
  decodeMsPerToken: number;
  /** Decode slowdown per additional running request (batching is not free). */
  decodeBatchFactor: number;
  /** Requests running at once; the rest wait in FIFO order. */
  maxRunning: number;
};

export const DEFAULT_TIMING: TimingParams = {
  speed: 1,
  prefillBaseMs: 5,
  prefillMsPerToken: 0.1,
  decodeMsPerToken: 10,
  decodeBatchFactor: 0.01,
  maxRunning: 64,
};

export class TimingModel {
  readonly params: TimingParams;

  constructor(params: Partial<TimingParams> = {}) {
    this.params = { ...DEFAULT_TIMING, ...params };
  }

  /** Prefill time; at least one token is always computed, as in vLLM when the whole prompt is cached. */
  prefillMs(promptTokens: number, cachedTokens: number): number {
    const p = this.params;
    const uncached = Math.max(1, promptTokens - cachedTokens);
    return p.speed * (p.prefillBaseMs + uncached * p.prefillMsPerToken);
  }

  /** Time for one output token while `running` requests share the engine. */
  decodeMsPerToken(running: number): number {
    const p = this.params;
    return p.speed * p.decodeMsPerToken * (1 + p.decodeBatchFactor * Math.max(0, running - 1));
  }

  /** Admission-to-last-token time of a request, for simulation in virtual time. */
  requestMs(promptTokens: number, cachedTokens: number, outputTokens: number, running = 1): { ttftMs: number; totalMs: number } {
    const ttftMs = this.prefillMs(promptTokens, cachedTokens);
    const rest = Math.max(0, outputTokens - 1) * this.decodeMsPerToken(running);
    return { ttftMs, totalMs: ttftMs + rest };
  }
}
