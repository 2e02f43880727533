import { createServer } from "node:net";

function canBind(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once("error", () => resolve(false));
    srv.listen({ host, port, exclusive: true }, () => srv.close(() => resolve(true)));
  });
}

/**
 * Which of `ports` cannot be bound on `host` right now: held there, or on the wildcard address (Linux
 * then refuses the specific bind), typically by a process left over from an interrupted run.
 */
export async function heldPorts(host: string, ports: readonly number[]): Promise<number[]> {
  const held: number[] = [];
  for (const p of ports) if (!(await canBind(host, p))) held.push(p);
  return held;
}

/** A port that was free on `host` a moment ago (bind to 0, read, release). */
export function freePort(host = "127.0.0.1"): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, host, () => {
      const addr = srv.address();
      const port = typeof addr === "object" && addr ? addr.port : 0;
      srv.close(() => (port ? resolve(port) : reject(new Error("no port"))));
    });
  });
}
