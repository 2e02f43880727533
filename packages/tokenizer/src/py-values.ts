// Python's view of request JSON, as vLLM's chat templates see it. vLLM parses the request with Python's json
// (pydantic keeps a float a float), so `1.0` stays `1.0` through `tojson`, while JSON.parse makes it the number 1
// and the template prints `1`. These helpers keep that distinction and print values as Python prints them.

/** A JSON number JavaScript would print otherwise than Python: marked with how Python reads it. */
export abstract class PyNumber {
  constructor(readonly value: number) {}
  /** Plain JSON.stringify (logs, size estimates) sees the number. */
  toJSON(): number {
    return this.value;
  }
}

/** A JSON number written with a fraction or an exponent (`1.0`, `2e3`): Python's float. */
export class PyFloat extends PyNumber {}

/** An integer past 2^53 (a JSON Schema's int64 bound): Python's int keeps every digit, a JavaScript number does not. */
export class PyInt extends PyNumber {
  constructor(readonly digits: string) {
    super(Number(digits));
  }
}

/** A JSON object as Python's json gives it, a dict: not an array, nor a number kept as a PyNumber (an object here). */
export const isPyDict = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v) && !(v instanceof PyNumber);

/**
 * JSON.parse that keeps Python's view of numbers: those written with `.`, `e` or `E` become PyFloat, integers past
 * 2^53 PyInt (their digits as written). Uses the reviver's source text (JSON.parse source access), so the cost is
 * one callback per value.
 */
export function parseJsonKeepingFloats(text: string): unknown {
  return JSON.parse(text, (_key, value: unknown, context?: { source?: string }) => {
    if (typeof value !== "number" || context?.source === undefined) return value;
    if (/[.eE]/.test(context.source)) return new PyFloat(value);
    return Number.isSafeInteger(value) ? value : new PyInt(context.source);
  });
}

/** repr(float) in Python 3: shortest round-trip digits, exponent form below 1e-4 and from 1e16 on. */
export function pyFloatRepr(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const [mantissa, expText] = x.toExponential().split("e") as [string, string];
  const exp = Number(expText);
  const digits = mantissa.replace("-", "").replace(".", "");
  const sign = x < 0 ? "-" : "";
  if (exp < -4 || exp >= 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    return `${sign}${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  }
  if (exp < 0) return `${sign}0.${"0".repeat(-exp - 1)}${digits}`;
  return `${sign}${digits.slice(0, exp + 1).padEnd(exp + 1, "0")}.${digits.slice(exp + 1) || "0"}`;
}

// str.isspace() in Python: what strip()/split() without arguments remove. Not JavaScript's \s (which has
// U+FEFF and lacks U+001C..U+001F and U+0085).
const PY_SPACE = new Set([..."\t\n\v\f\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000"]);
for (let c = 0x2000; c <= 0x200a; c++) PY_SPACE.add(String.fromCharCode(c));

/** Python's str.strip/lstrip/rstrip: `chars` (null: whitespace) removed from the chosen ends. */
export function pyStrip(s: string, chars: string | null, ends: "both" | "left" | "right"): string {
  const strip = chars === null ? PY_SPACE : new Set([...chars]);
  const cps = [...s];
  let start = 0;
  let end = cps.length;
  if (ends !== "right") while (start < end && strip.has(cps[start]!)) start++;
  if (ends !== "left") while (end > start && strip.has(cps[end - 1]!)) end--;
  return start === 0 && end === cps.length ? s : cps.slice(start, end).join("");
}

/** repr(str) in Python: single quotes unless the text has ' and no ", non-printable characters escaped. */
export function pyStrRepr(s: string): string {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  let out = quote;
  for (const ch of s) {
    const cp = ch.codePointAt(0)!;
    if (ch === quote || ch === "\\") out += `\\${ch}`;
    else if (ch === "\n") out += "\\n";
    else if (ch === "\r") out += "\\r";
    else if (ch === "\t") out += "\\t";
    else if (ch !== " " && NON_PRINTABLE.test(ch)) {
      out += cp < 0x100 ? `\\x${hex(cp, 2)}` : cp < 0x10000 ? `\\u${hex(cp, 4)}` : `\\U${hex(cp, 8)}`;
    } else out += ch;
  }
  return out + quote;
}

// str.isprintable() is false for these general categories (the space aside).
const NON_PRINTABLE = /^[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}]$/u;

function hex(n: number, width: number): string {
  return n.toString(16).padStart(width, "0");
}
