// grpc.health.v1.Health as llm-d's router answers it without leader election (every replica active, as here): any
// service name follows readiness (NOT_SERVING until recovery has ended, and first on shutdown), "liveness" excepted,
// which is the process; no name is unknown. List names the ext_proc service alone, as llm-d's does in that mode.
import * as grpc from "@grpc/grpc-js";
import { EXT_PROC_SERVICE } from "./extproc/protos.ts";

export type ServingStatus = "SERVING" | "NOT_SERVING";

/**
 * The one name that does not follow readiness. It stays SERVING while draining too: a failing liveness probe would
 * have the kubelet kill the process mid-drain (llm-d's router keeps it so with leader election on; without, it fails
 * it while draining).
 */
export const LIVENESS_SERVICE = "liveness";

type Watcher = (status: ServingStatus) => void;

export class HealthState {
  private readiness: ServingStatus = "NOT_SERVING";
  private readonly watchers = new Set<Watcher>();
  private draining = false;

  /** No effect once draining: a recovery ending during shutdown must not report SERVING again. */
  setReady(ready: boolean): void {
    if (this.draining) return;
    this.setReadiness(ready ? "SERVING" : "NOT_SERVING");
  }

  get ready(): boolean {
    return this.readiness === "SERVING";
  }

  /** Shutdown: every name but liveness reports NOT_SERVING so probes and gateways stop sending. */
  drain(): void {
    this.draining = true;
    this.setReadiness("NOT_SERVING");
  }

  status(service: string): ServingStatus {
    return service === LIVENESS_SERVICE ? "SERVING" : this.readiness;
  }

  /** What List answers. */
  list(): Record<string, ServingStatus> {
    return { [EXT_PROC_SERVICE]: this.status(EXT_PROC_SERVICE) };
  }

  /** Told each change of `service`'s status (liveness never changes). */
  watch(service: string, w: Watcher): () => void {
    if (service === LIVENESS_SERVICE) return () => {};
    this.watchers.add(w);
    return () => this.watchers.delete(w);
  }

  private setReadiness(s: ServingStatus): void {
    if (this.readiness === s) return;
    this.readiness = s;
    for (const w of this.watchers) w(s);
  }
}

type Req = { service?: string };
type Res = { status: ServingStatus };
type ListRes = { statuses: Record<string, Res> };

function listed(state: HealthState): ListRes {
  return { statuses: Object.fromEntries(Object.entries(state.list()).map(([name, status]) => [name, { status }])) };
}

export function healthHandlers(state: HealthState): grpc.UntypedServiceImplementation {
  return {
    Check(call: grpc.ServerUnaryCall<Req, Res>, cb: grpc.sendUnaryData<Res>) {
      cb(null, { status: state.status(call.request.service ?? "") });
    },
    List(_call: grpc.ServerUnaryCall<object, ListRes>, cb: grpc.sendUnaryData<ListRes>) {
      cb(null, listed(state));
    },
    Watch(call: grpc.ServerWritableStream<Req, Res>) {
      const service = call.request.service ?? "";
      call.write({ status: state.status(service) });
      const stop = state.watch(service, (next) => call.write({ status: next }));
      call.on("cancelled", stop);
      call.on("close", stop);
    },
  };
}

type Method<I, O> = Pick<grpc.MethodDefinition<I, O>, "requestDeserialize" | "responseSerialize">;

/**
 * grpc.health.v1.Health/Check and List as unary handlers over raw bytes, for the ext_proc port (`--health-checking`,
 * as GAIE's EPP registers health on its ext_proc server).
 */
export function healthBytes(state: HealthState, check: Method<Req, Res>, list: Method<object, ListRes>): { check: (b: Buffer) => Buffer; list: (b: Buffer) => Buffer } {
  return {
    check: (request) => check.responseSerialize({ status: state.status(check.requestDeserialize(request).service ?? "") }),
    list: () => list.responseSerialize(listed(state)),
  };
}
