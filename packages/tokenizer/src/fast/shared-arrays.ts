type IntArray = Int32Array | Uint16Array | Uint32Array;

/**
 * A copy of `a` in a SharedArrayBuffer: posted to a worker (workerData, postMessage) it is the same memory there, not
 * a copy, so every pool member reads one set of a model's tables.
 */
export function sharedCopy<T extends IntArray>(a: T): T {
  const copy = new (a.constructor as new (buffer: SharedArrayBuffer) => T)(new SharedArrayBuffer(a.byteLength));
  copy.set(a);
  return copy;
}
