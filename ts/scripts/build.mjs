// The package's build, run by `npm run build` and by `npm pack` / `npm publish` (prepack):
// dist/ holds ES modules, dist/cjs/ CommonJS, each with its declarations and source maps that
// carry their sources (src/ is not shipped). The repository's licence is copied in when present.
import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = join(dirname(fileURLToPath(import.meta.url)), "..");
const tsc = join(here, "node_modules", "typescript", "bin", "tsc");

rmSync(join(here, "dist"), { recursive: true, force: true });
for (const project of ["tsconfig.build.json", "tsconfig.cjs.json"]) {
  execFileSync(process.execPath, [tsc, "-p", join(here, project)], { stdio: "inherit", cwd: here });
}
// The package is "type": "module": this marks dist/cjs/*.js as CommonJS for Node.
writeFileSync(join(here, "dist", "cjs", "package.json"), '{ "type": "commonjs" }\n');

const licence = join(here, "..", "LICENSE");
if (existsSync(licence)) copyFileSync(licence, join(here, "LICENSE"));
else console.warn("build: no LICENSE at the repository's root; the package ships without one");
