// Test helper: a TCP forwarder whose link can be cut (a network blip between worker and listener).
import { connect, createServer, type Server, type Socket } from "node:net";
import { parseEndpoint } from "@kv-epp/protocol";
import { LOOPBACK } from "./loopback.ts";

export class TcpProxy {
  private readonly pairs = new Set<Socket>();
  private down = false;
  private constructor(private readonly server: Server, readonly endpoint: string) {}

  static async start(target: string, host = `${LOOPBACK}.1.3`): Promise<TcpProxy> {
    const t = parseEndpoint(target);
    let proxy: TcpProxy;
    const server = createServer((client) => {
      if (proxy.down) return void client.destroy();
      const upstream = connect({ host: t.host, port: t.port });
      for (const [a, b] of [[client, upstream], [upstream, client]] as const) {
        proxy.pairs.add(a);
        a.pipe(b);
        a.on("error", () => b.destroy());
        a.on("close", () => {
          proxy.pairs.delete(a);
          b.destroy();
        });
      }
    });
    await new Promise<void>((r) => server.listen(0, host, () => r()));
    proxy = new TcpProxy(server, `tcp://${host}:${(server.address() as { port: number }).port}`);
    return proxy;
  }

  /** Drops every forwarded connection and refuses new ones until restore(). */
  cut(): void {
    this.down = true;
    for (const s of this.pairs) s.destroy();
  }

  restore(): void {
    this.down = false;
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((r) => this.server.close(() => r()));
  }
}
