// Hashes held with a copy count (a hash stored twice is removed twice): one definition for the event
// builders that track what they published.

export function addCopy(m: Map<bigint, number>, h: bigint): void {
  m.set(h, (m.get(h) ?? 0) + 1);
}

/** Takes one copy of `h`; false when none is held. */
export function takeCopy(m: Map<bigint, number>, h: bigint): boolean {
  const n = m.get(h);
  if (!n) return false;
  if (n === 1) m.delete(h);
  else m.set(h, n - 1);
  return true;
}
