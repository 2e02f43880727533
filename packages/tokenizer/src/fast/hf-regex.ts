/**
 * Hugging Face's tokenizers run their Split patterns with Oniguruma; JavaScript's engine (with the `u` flag)
 * reads the same syntax, including `(?i:...)` groups, except `\s`: Oniguruma's is Unicode White_Space
 * (U+0085 included, U+FEFF not), JavaScript's is not. So `\s`/`\S` are rewritten to the property; the rest is
 * kept as written. Equality with the reference is checked by the property tests on random text.
 */
export function hfRegexToJs(pattern: string): RegExp {
  let out = "";
  let inClass = false;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === "\\") {
      const n = pattern[i + 1] ?? "";
      i++;
      if (n === "s") out += "\\p{White_Space}";
      else if (n === "S") {
        if (inClass) throw new Error(`unsupported \\S inside a character class in ${pattern}`);
        out += "\\P{White_Space}";
      } else out += c + n;
      continue;
    }
    if (c === "[" && !inClass) inClass = true;
    else if (c === "[" && inClass) throw new Error(`unsupported nested character class in ${pattern}`);
    else if (c === "]" && inClass) inClass = false;
    out += c;
  }
  return new RegExp(out, "gu");
}
