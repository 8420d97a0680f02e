// Internal to the collectives library: the ranks of an exchange by recursive
// doubling over a group of any size n. p, the largest power of two ≤ n, take
// part in the core rounds. The first 2(n-p) ranks pair up around it: the even
// one hands its part to its odd neighbour before the core rounds and gets the
// result back after them (the all-reduces' FoldIn and FoldOut, the header
// relay of Call::Exchange).
#pragma once

namespace tessera::collectives {

struct CoreRanks {
  int p = 1;
  int folded = 0;  // pairs
  int rank = -1;   // position in the core; -1 for a rank that sits out

  CoreRanks(int n, int me) {
    while (p * 2 <= n) p *= 2;
    folded = n - p;
    if (me >= 2 * folded) {
      rank = me - folded;
    } else if (me % 2 == 1) {
      rank = me / 2;
    }
  }
  // The group rank of core position `c`.
  int Member(int c) const { return c < folded ? c * 2 + 1 : c + folded; }
};

}  // namespace tessera::collectives
