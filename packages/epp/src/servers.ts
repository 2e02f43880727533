// The EPP's four listening servers, each started from what it serves: ext_proc (node:http2, TLS by
// default, its certificate reloaded from files), grpc.health.v1 (grpc-js, plaintext for the kubelet),
// selection HTTP and Prometheus /metrics (Bun.serve).
import * as grpc from "@grpc/grpc-js";
import { hostPort } from "@kv-epp/protocol";
import type { Logger } from "pino";
import { ConfigError, type EppConfig } from "./config.ts";
import { createBidiServer } from "./extproc/grpc-h2.ts";
import { EXT_PROC_WINDOW_BYTES } from "./extproc/http2-windows.ts";
import { responseEncoder, type ProcessingRequest, type ProcessingResponse } from "./extproc/messages.ts";
import { loadProtos } from "./extproc/protos.ts";
import { besideBodyOverSoFar, bytesBesideBody } from "./extproc/request-bulk.ts";
import { createProcessHandler, type ExtProcDeps } from "./extproc/server.ts";
import { readCertificate, selfSignedCertificate, watchCertificate, type Certificate } from "./extproc/tls.ts";
import { healthBytes, healthHandlers, type HealthState } from "./health.ts";
import { throttledWarn } from "./log-throttle.ts";
import type { Metrics } from "./metrics.ts";

export type Server = { port: number; stop(): Promise<void> | void };

/** The configured certificate (files, or a fresh self-signed one); undefined for h2c. First, so a bad pair stops the start before anything listens. */
export async function loadCertificate(tls: EppConfig["tls"]): Promise<Certificate | undefined> {
  try {
    return tls.mode === "files" ? readCertificate(tls) : tls.mode === "self-signed" ? await selfSignedCertificate() : undefined;
  } catch (err) {
    throw new ConfigError(`cannot load --tls-cert-file/--tls-key-file: ${(err as Error).message}`);
  }
}

export type ExtProcServer = Server & {
  /** GOAWAY, then up to `graceMs` for the streams in flight (the rest end UNAVAILABLE). */
  shutdown(graceMs: number): Promise<void>;
};

export async function startExtProc(
  cfg: Pick<EppConfig, "listen" | "ports" | "tls" | "healthOnExtProc">,
  o: { handler: ExtProcDeps; certificate: Certificate | undefined; health: HealthState; metrics: Metrics; /** The process's logger (ext_proc and tls children are taken). */ log: Logger },
): Promise<ExtProcServer> {
  const protos = loadProtos();
  const method = protos.extProc.service.Process!;
  const metrics = o.metrics;
  const log = o.log.child({ component: "ext_proc" });
  const warnRejected = throttledWarn(log, "ext_proc stream rejected");
  const server = createBidiServer(
    {
      path: method.path,
      deserialize: method.requestDeserialize as (b: Buffer) => ProcessingRequest,
      serialize: responseEncoder(method.responseSerialize as (m: ProcessingResponse) => Buffer),
      besideBulk: bytesBesideBody,
      besideBulkOverSoFar: besideBodyOverSoFar,
    },
    createProcessHandler(o.handler),
    {
      // BUFFERED mode sends the whole body as one message: allow bodies up to the 32 MiB request cap.
      maxMessageBytes: 40 * 1024 * 1024,
      // Only a body may be large: Envoy caps headers at tens of KiB, and the rest is decoded into objects.
      smallMessageBytes: 1024 * 1024,
      // A message that stops arriving, or answers left unread, give their part of the receive budget back after this.
      stallMs: 10_000,
      windowBytes: EXT_PROC_WINDOW_BYTES,
      unary: cfg.healthOnExtProc ? healthOnExtProc(o.health) : undefined,
      tls: o.certificate,
      onError: (where, err) => log.debug({ where, err: String(err) }, "ext_proc transport error"),
      receiveBudget: o.handler.bodyBudget,
      onRejected: (reason, err) => {
        metrics.extProcRejected.inc({ reason });
        warnRejected(reason, { err: err === undefined ? undefined : String(err) });
      },
    },
  );
  const port = await server.listen(cfg.listen, cfg.ports.grpc);
  const tlsLog = o.log.child({ component: "tls" });
  const certWatch =
    cfg.tls.mode === "files"
      ? watchCertificate(cfg.tls, o.certificate!, {
          change: (c) => {
            server.setCertificate(c);
            metrics.tlsReloads.inc({ result: "ok" });
            tlsLog.info({ cert: cfg.tls.mode === "files" && cfg.tls.certFile }, "TLS certificate reloaded");
          },
          error: (err) => {
            metrics.tlsReloads.inc({ result: "error" });
            tlsLog.warn({ err: String(err) }, "TLS certificate reload failed; serving the previous one");
          },
        })
      : undefined;
  tlsLog.info({ mode: cfg.tls.mode }, cfg.tls.mode === "off" ? "ext_proc serves h2c (plaintext)" : "ext_proc serves TLS (ALPN h2)");
  return {
    port,
    shutdown: (graceMs) => server.shutdown(graceMs),
    stop: () => certWatch?.stop(),
  };
}

/** Kubelet gRPC probes do not speak TLS, so health stays plaintext. */
export async function startHealth(cfg: Pick<EppConfig, "listen" | "ports">, health: HealthState): Promise<Server> {
  const server = new grpc.Server();
  server.addService(loadProtos().health.service, healthHandlers(health));
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync(hostPort(cfg.listen, cfg.ports.grpcHealth), grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  return { port, stop: () => server.forceShutdown() };
}

/** grpc.health.v1.Health's Check and List on the ext_proc port (`--health-checking`), over its TLS. */
function healthOnExtProc(health: HealthState): Record<string, (b: Buffer) => Buffer> {
  const { Check: check, List: list } = loadProtos().health.service;
  const bytes = healthBytes(health, check!, list!);
  return { [check!.path]: bytes.check, [list!.path]: bytes.list };
}

export function startHttp(
  cfg: Pick<EppConfig, "listen">,
  port: number,
  fetch: (req: Request) => Response | Promise<Response>,
  // A large /dump may stream for longer than Bun's default idle timeout.
  opts: { idleTimeout?: number } = {},
): Server {
  const server = Bun.serve({ hostname: cfg.listen, port, fetch, ...opts });
  return { port: server.port!, stop: () => server.stop(true) };
}

/** Prometheus /metrics; `beforeRender` refreshes the gauges read at scrape time. */
export function metricsFetch(metrics: Metrics, beforeRender: () => void): (req: Request) => Promise<Response> {
  return async (req) => {
    if (new URL(req.url).pathname !== "/metrics") return new Response("not found", { status: 404 });
    beforeRender();
    return new Response(await metrics.registry.metrics(), { headers: { "content-type": metrics.registry.contentType } });
  };
}
