/** Python's repr() of the values the core names in its messages, so that an error message (and so
 * a trace) reads the same from both SDKs. */

export function reprString(text: string): string {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  let out = quote;
  for (const char of text) {
    const code = char.codePointAt(0) ?? 0;
    if (char === "\\") out += "\\\\";
    else if (char === quote) out += "\\" + quote;
    else if (char === "\n") out += "\\n";
    else if (char === "\r") out += "\\r";
    else if (char === "\t") out += "\\t";
    else if (code < 0x20 || code === 0x7f) out += "\\x" + code.toString(16).padStart(2, "0");
    else out += char;
  }
  return out + quote;
}

/** repr() of a float the way Python writes it: shortest round trip, exponent from 1e16 and below
 * 1e-4, with a sign and at least two digits. */
export function reprFloat(value: number): string {
  if (Number.isNaN(value)) return "nan";
  if (!Number.isFinite(value)) return value > 0 ? "inf" : "-inf";
  if (value === 0) return Object.is(value, -0) ? "-0.0" : "0.0";
  const [mantissa, exp] = value.toExponential().split("e") as [string, string];
  const exponent = Number(exp);
  if (exponent < -4 || exponent >= 16) {
    const sign = exponent < 0 ? "-" : "+";
    return `${mantissa}e${sign}${String(Math.abs(exponent)).padStart(2, "0")}`;
  }
  const text = String(value);
  return text.includes(".") ? text : `${text}.0`;
}

/** repr() of a JSON-like value: numbers that are integers print as Python ints. */
export function repr(value: unknown): string {
  if (value === null || value === undefined) return "None";
  if (typeof value === "string") return reprString(value);
  if (typeof value === "boolean") return value ? "True" : "False";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : reprFloat(value);
  if (typeof value === "bigint") return String(value);
  if (Array.isArray(value)) return `[${value.map(repr).join(", ")}]`;
  if (typeof value === "object") {
    const items = Object.entries(value as Record<string, unknown>);
    return `{${items.map(([k, v]) => `${reprString(k)}: ${repr(v)}`).join(", ")}}`;
  }
  return String(value);
}

/** str() of a value, as Python's ``like`` operator compares it. */
export function str(value: unknown): string {
  return typeof value === "string" ? value : repr(value);
}

/** type(value).__name__ for the values a caller can pass. */
export function typeName(value: unknown): string {
  if (value === null || value === undefined) return "NoneType";
  if (typeof value === "string") return "str";
  if (typeof value === "boolean") return "bool";
  if (typeof value === "number") return Number.isInteger(value) ? "int" : "float";
  if (Array.isArray(value)) return "list";
  if (value instanceof Uint8Array) return "bytes";
  if (typeof value === "object") return "dict";
  return typeof value;
}

/** Python's sorted() of strings: by code point (JavaScript's default compares UTF-16 units). */
export function byCodePoint(a: string, b: string): number {
  if (a === b) return 0;
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i++) {
    const p = (x[i] as string).codePointAt(0) as number;
    const q = (y[i] as string).codePointAt(0) as number;
    if (p !== q) return p - q;
  }
  return x.length - y.length;
}

/** Python's json.dumps() of a parsed JSON value: ", " and ": " separators, non-ASCII escaped,
 * floats as repr() writes them. */
export function pyJsonDumps(value: unknown): string {
  if (value === null || value === undefined) return "null";
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : reprFloat(value);
  if (typeof value === "string") {
    return JSON.stringify(value).replace(/[\u007f-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  }
  if (Array.isArray(value)) return `[${value.map(pyJsonDumps).join(", ")}]`;
  const items = Object.entries(value as Record<string, unknown>);
  return `{${items.map(([k, v]) => `${pyJsonDumps(k)}: ${pyJsonDumps(v)}`).join(", ")}}`;
}
