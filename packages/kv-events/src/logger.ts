// The slice of a pino logger this package uses; callers pass `pino().child({...})`.
// Kept structural so the package does not depend on pino itself.
export type Logger = {
  debug(obj: object, msg?: string): void;
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
  child?(bindings: object): Logger;
};

const noop = () => {};
export const silentLogger: Logger = { debug: noop, info: noop, warn: noop, error: noop };

export function childLogger(log: Logger | undefined, bindings: object): Logger {
  if (!log) return silentLogger;
  return log.child ? log.child(bindings) : log;
}
