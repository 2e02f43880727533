// grpc.health.v1.Health: "liveness" reports the process; "" (a load balancer's overall check), "readiness", the
// ext_proc service and "inference-extension" stay NOT_SERVING until recovery has ended, and go NOT_SERVING first
// on shutdown (llm-d's router answers "" by its readiness rule too).
import * as grpc from "@grpc/grpc-js";
import { EXT_PROC_SERVICE } from "./extproc/protos.ts";

export type ServingStatus = "SERVING" | "NOT_SERVING";

/**
 * The name GAIE's conformance manifests and its chart (one replica) probe for both liveness and
 * readiness; its EPP answers any name with the readiness rule there, so this one follows readiness.
 */
export const GAIE_PROBE_SERVICE = "inference-extension";

/**
 * The services that follow readiness (NOT_SERVING until recovery has ended, and while draining). "" among them: a
 * gateway's or probe's check that names no service asks whether to send traffic, not whether to restart us.
 */
const READINESS_SERVICES = ["", "readiness", EXT_PROC_SERVICE, GAIE_PROBE_SERVICE] as const;

type Watcher = (status: ServingStatus) => void;

export class HealthState {
  private readonly statusByService = new Map<string, ServingStatus>();
  private readonly watchers = new Map<string, Set<Watcher>>();
  private draining = false;

  constructor() {
    this.set("liveness", "SERVING");
    for (const name of READINESS_SERVICES) this.set(name, "NOT_SERVING");
  }

  /** No effect once draining: a recovery ending during shutdown must not report SERVING again. */
  setReady(ready: boolean): void {
    if (this.draining) return;
    const s: ServingStatus = ready ? "SERVING" : "NOT_SERVING";
    for (const name of READINESS_SERVICES) this.set(name, s);
  }

  get ready(): boolean {
    return this.statusByService.get("readiness") === "SERVING";
  }

  /**
   * Shutdown: readiness and the ext_proc service report NOT_SERVING so probes and gateways stop
   * sending. Liveness stays SERVING: the process is alive and draining, and a
   * failing liveness probe would have the kubelet kill it mid-drain.
   */
  drain(): void {
    this.draining = true;
    for (const name of READINESS_SERVICES) this.set(name, "NOT_SERVING");
  }

  status(service: string): ServingStatus | undefined {
    return this.statusByService.get(service);
  }

  watch(service: string, w: Watcher): () => void {
    let set = this.watchers.get(service);
    if (!set) this.watchers.set(service, (set = new Set()));
    set.add(w);
    return () => set.delete(w);
  }

  private set(service: string, s: ServingStatus): void {
    if (this.statusByService.get(service) === s) return;
    this.statusByService.set(service, s);
    for (const w of this.watchers.get(service) ?? []) w(s);
  }
}

type Req = { service?: string };
type Res = { status: ServingStatus | "SERVICE_UNKNOWN" };

export function healthHandlers(state: HealthState): grpc.UntypedServiceImplementation {
  return {
    Check(call: grpc.ServerUnaryCall<Req, Res>, cb: grpc.sendUnaryData<Res>) {
      const s = state.status(call.request.service ?? "");
      if (s === undefined) cb({ code: grpc.status.NOT_FOUND, details: `unknown service ${JSON.stringify(call.request.service)}` });
      else cb(null, { status: s });
    },
    Watch(call: grpc.ServerWritableStream<Req, Res>) {
      const service = call.request.service ?? "";
      const s = state.status(service);
      call.write({ status: s ?? "SERVICE_UNKNOWN" });
      if (s === undefined) return;
      const stop = state.watch(service, (next) => call.write({ status: next }));
      call.on("cancelled", stop);
      call.on("close", stop);
    },
  };
}

/**
 * grpc.health.v1.Health/Check as a unary handler over raw bytes, for the ext_proc port (`--health-checking`,
 * as GAIE's EPP registers health on its ext_proc server): an unknown service is NOT_FOUND.
 */
export function healthCheckBytes(
  state: HealthState,
  codec: { decode(b: Buffer): Req; encode(r: Res): Buffer },
): (request: Buffer) => Buffer | { code: 5; message: string } {
  return (request) => {
    const service = codec.decode(request).service ?? "";
    const s = state.status(service);
    return s === undefined ? { code: 5, message: `unknown service ${JSON.stringify(service)}` } : codec.encode({ status: s });
  };
}
