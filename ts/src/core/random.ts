/** Randomness comes in as data: the machines draw from a generator their driver gives them. */
export interface Random {
  /** A uniform draw in [0, 1). */
  random(): number;
}

/** Bytes for the WebSocket's handshake key and masks (crypto.randomBytes in the driver). */
export type RandomBytes = (n: number) => Uint8Array;

/** Python's `random.Random(seed)` (MT19937, seeded by init_by_array) and its `random()`: the same
 * draws, so delivery and link traces recorded by the Python core replay here unchanged. */
export class PythonRandom implements Random {
  private readonly mt = new Uint32Array(624);
  private index = 625;

  constructor(seed: number | bigint) {
    let rest = BigInt(seed) < 0n ? -BigInt(seed) : BigInt(seed);
    const key: number[] = [];
    while (rest > 0n) {
      key.push(Number(rest & 0xffffffffn));
      rest >>= 32n;
    }
    if (key.length === 0) key.push(0);
    this.initByArray(key);
  }

  private initGenrand(s: number): void {
    const mt = this.mt;
    mt[0] = s >>> 0;
    for (let i = 1; i < 624; i++) {
      const prev = (mt[i - 1] as number) ^ ((mt[i - 1] as number) >>> 30);
      mt[i] = (Math.imul(1812433253, prev) + i) >>> 0;
    }
    this.index = 624;
  }

  private initByArray(key: number[]): void {
    const mt = this.mt;
    this.initGenrand(19650218);
    let i = 1;
    let j = 0;
    for (let k = Math.max(624, key.length); k > 0; k--) {
      const prev = (mt[i - 1] as number) ^ ((mt[i - 1] as number) >>> 30);
      mt[i] = (((mt[i] as number) ^ Math.imul(prev, 1664525)) + (key[j] as number) + j) >>> 0;
      i++;
      j++;
      if (i >= 624) {
        mt[0] = mt[623] as number;
        i = 1;
      }
      if (j >= key.length) j = 0;
    }
    for (let k = 623; k > 0; k--) {
      const prev = (mt[i - 1] as number) ^ ((mt[i - 1] as number) >>> 30);
      mt[i] = (((mt[i] as number) ^ Math.imul(prev, 1566083941)) - i) >>> 0;
      i++;
      if (i >= 624) {
        mt[0] = mt[623] as number;
        i = 1;
      }
    }
    mt[0] = 0x80000000;
  }

  private next32(): number {
    const mt = this.mt;
    if (this.index >= 624) {
      for (let k = 0; k < 624; k++) {
        const y = ((mt[k] as number) & 0x80000000) | ((mt[(k + 1) % 624] as number) & 0x7fffffff);
        mt[k] = ((mt[(k + 397) % 624] as number) ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0)) >>> 0;
      }
      this.index = 0;
    }
    let y = mt[this.index++] as number;
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  random(): number {
    const a = this.next32() >>> 5;
    const b = this.next32() >>> 6;
    return (a * 67108864 + b) * (1 / 9007199254740992);
  }
}
