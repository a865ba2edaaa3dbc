/** Polar's filter SQL has been seen to read a dotted property (`_cost.amount`) as one key named
 * with the dot, and metadata may hold such a key: the core counts a clause, and takes a value,
 * under either reading (tests/conformance/test_sql_postgres.py checks it against PostgreSQL). */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { counts, safeValue } from "../../src/core/configuration.js";
import { parseAggregation, parseFilter } from "../../src/core/filters.js";
import { sqlValue } from "../../src/core/sqlFilters.js";

const at = (metadata: Record<string, unknown>) => ({ name: "x", timestampS: 0, metadata });
const where = (property: string, operator: string, value: unknown) =>
  parseFilter({ conjunction: "and", clauses: [{ property, operator, value }] });

describe("a dotted property read as one key", () => {
  it("counts a clause under either reading", () => {
    assert.equal(counts(where("_cost.currency", "ne", "3"), at({ "_cost.currency": "usd" })), true);
    assert.equal(counts(where("a.b", "gt", 3), at({ "a.b": 4 })), true);
    assert.equal(counts(where("a.b", "gt", 5), at({ "a.b": 4 })), false);
    assert.equal(counts(where("a.b", "eq", 2), at({ a: { b: 2 }, "a.b": "x" })), true);
  });

  it("takes the larger value of the two readings", () => {
    const sum = parseAggregation({ func: "sum", property: "a.b" });
    assert.equal(sqlValue(sum, at({ "a.b": 4 })), 4);
    assert.equal(sqlValue(sum, at({ a: { b: 9 }, "a.b": 7 })), 9);
    assert.equal(sqlValue(sum, at({ a: { b: 2 }, "a.b": 7 })), 7);
    assert.equal(sqlValue(sum, at({})), null);
    assert.equal(safeValue(sum, at({ "a.b": 4 })), 4);
    assert.equal(safeValue(sum, at({ a: { b: 2 } })), 2);
    assert.equal(safeValue(sum, at({ a: { b: 9 }, "a.b": 7 })), 9);
    assert.equal(safeValue(sum, at({})), null);
  });
});
