import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

/** The repository's root: the conformance files and lua/ are read from there, never copied. */
export const REPO = join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
export const CONFORMANCE = join(REPO, "conformance");
