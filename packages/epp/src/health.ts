// grpc.health.v1.Health: "" and "liveness" report the process; "readiness" and the ext_proc service
// stay NOT_SERVING until recovery has ended, and go NOT_SERVING first on shutdown.
import * as grpc from "@grpc/grpc-js";
import { EXT_PROC_SERVICE } from "./extproc/protos.ts";

export type ServingStatus = "SERVING" | "NOT_SERVING";

export const HEALTH_SERVICES = ["", "liveness", "readiness", EXT_PROC_SERVICE] as const;

type Watcher = (status: ServingStatus) => void;

export class HealthState {
  readonly #status = new Map<string, ServingStatus>();
  readonly #watchers = new Map<string, Set<Watcher>>();
  #draining = false;

  constructor() {
    this.#set("", "SERVING");
    this.#set("liveness", "SERVING");
    this.#set("readiness", "NOT_SERVING");
    this.#set(EXT_PROC_SERVICE, "NOT_SERVING");
  }

  /** No effect once draining: a recovery ending during shutdown must not report SERVING again. */
  setReady(ready: boolean): void {
    if (this.#draining) return;
    const s: ServingStatus = ready ? "SERVING" : "NOT_SERVING";
    this.#set("readiness", s);
    this.#set(EXT_PROC_SERVICE, s);
  }

  get ready(): boolean {
    return this.#status.get("readiness") === "SERVING";
  }

  /**
   * Shutdown: readiness and the ext_proc service report NOT_SERVING so probes and gateways stop
   * sending. Liveness ("" and "liveness") stays SERVING: the process is alive and draining, and a
   * failing liveness probe would have the kubelet kill it mid-drain.
   */
  drain(): void {
    this.#draining = true;
    this.#set("readiness", "NOT_SERVING");
    this.#set(EXT_PROC_SERVICE, "NOT_SERVING");
  }

  status(service: string): ServingStatus | undefined {
    return this.#status.get(service);
  }

  watch(service: string, w: Watcher): () => void {
    let set = this.#watchers.get(service);
    if (!set) this.#watchers.set(service, (set = new Set()));
    set.add(w);
    return () => set.delete(w);
  }

  #set(service: string, s: ServingStatus): void {
    if (this.#status.get(service) === s) return;
    this.#status.set(service, s);
    for (const w of this.#watchers.get(service) ?? []) w(s);
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
