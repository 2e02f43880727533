// Standard ports on per-pod loopback addresses collide with any process that holds the same port on
// the wildcard address (Linux refuses the specific bind then). A run should say so up front rather
// than fail somewhere inside a pod.
import { createServer } from "node:net";

function canBind(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const srv = createServer();
    srv.once("error", () => resolve(false));
    srv.listen({ host, port, exclusive: true }, () => srv.close(() => resolve(true)));
  });
}

/** Which of `ports` cannot be bound on `host` right now (held there or on the wildcard address). */
export async function heldPorts(host: string, ports: number[]): Promise<number[]> {
  const held: number[] = [];
  for (const p of ports) if (!(await canBind(host, p))) held.push(p);
  return held;
}
