// Wider HTTP/2 receive windows for the ext_proc server. Request bodies arrive as one gRPC message of
// 50-500 KB (a 12k-token prompt as token ids is ~75 KB), but an HTTP/2 server advertises 64 KiB per
// stream and 64 KiB per connection by default: a body larger than that waits for WINDOW_UPDATEs (a
// round trip through both event loops each), and concurrent uploads on one gateway connection share
// the 64 KiB. Envoy itself runs with 256 MiB/1 MiB windows. Measured with bench/large-body.ts (see the
// README's "Pick latency" section). @grpc/grpc-js has a client option for this
// (`grpc-node.flow_control_window`) but no server one, so the server's HTTP/2 settings are set here
// through grpc-js internals (`commonServerOptions`, `http2Servers`); when those change, nothing breaks:
// the defaults stay and `widenReceiveWindows` reports false.
import type * as grpc from "@grpc/grpc-js";

/** Per stream and per connection. */
export const EXT_PROC_WINDOW_BYTES = 16 * 1024 * 1024;

type Internals = {
  commonServerOptions?: { settings?: Record<string, unknown> };
  http2Servers?: Map<{ on(ev: "session", f: (s: { setLocalWindowSize?(n: number): void }) => void): void }, unknown>;
};

/** Call before bindAsync: the stream window goes into the server's SETTINGS. */
export function widenStreamWindow(server: grpc.Server, bytes = EXT_PROC_WINDOW_BYTES): boolean {
  const s = server as unknown as Internals;
  if (!s.commonServerOptions || typeof s.commonServerOptions !== "object") return false;
  s.commonServerOptions.settings = { ...s.commonServerOptions.settings, initialWindowSize: bytes };
  return true;
}

/** Call after bindAsync: every new connection gets a connection-level window of `bytes`. */
export function widenConnectionWindow(server: grpc.Server, bytes = EXT_PROC_WINDOW_BYTES): boolean {
  const servers = (server as unknown as Internals).http2Servers;
  if (!(servers instanceof Map) || servers.size === 0) return false;
  for (const http2Server of servers.keys())
    http2Server.on("session", (session) => {
      try {
        session.setLocalWindowSize?.(bytes);
      } catch {
        // A session closing as it opens: nothing to widen.
      }
    });
  return true;
}
