#!/usr/bin/python3
"""Unit tests of lazykv.cluster (no daemon): the routing formulas give the same known answers as
proto/lkv_route.c (tests/daemon/cluster/test_router.c pins the same values), shares follow the
weights, and a member joining moves only the share it takes.

Run: PYTHONPATH=<build>/python /usr/bin/python3 tests/client/python/test_cluster_unit.py
"""

import unittest

from lazykv import cluster


def lcg(x):
    return (x * 6364136223846793005 + 1442695040888963407) & ((1 << 64) - 1)


class Golden(unittest.TestCase):
    def test_same_values_as_c(self):
        self.assertEqual(cluster.route_hash(bytes(range(32)), [1, 2, 3]), 0xa8fd62e5f0e31e0c)
        self.assertEqual(cluster.member_seed("c0"), 0x3460e82b01767fd6)
        self.assertEqual(cluster.pick_owner([("a", 1), ("b", 1), ("c", 2)], 12345), "c")
        self.assertIsNone(cluster.pick_owner([], 12345))

    def test_every_input_counts(self):
        fp = bytes(range(32))
        h = cluster.route_hash(fp, [1, 2, 3])
        self.assertNotEqual(cluster.route_hash(fp, [1, 2, 4]), h)
        self.assertNotEqual(cluster.route_hash(fp, [1, 2]), h)
        self.assertNotEqual(cluster.route_hash(bytes(31) + b"\x01", [1, 2, 3]), h)
        with self.assertRaises(Exception):
            cluster.route_hash(b"short", [1])


class Shares(unittest.TestCase):
    def test_weights_and_one_nth(self):
        members = [("m1", 1), ("m2", 2), ("m3", 3)]
        cnt = {"m1": 0, "m2": 0, "m3": 0, "m4": 0}
        moved = wrong = 0
        x, n = 1, 20000
        for _ in range(n):
            x = lcg(x)
            a = cluster.pick_owner(members, x)
            cnt[a] += 1
            b = cluster.pick_owner(members + [("m4", 2)], x)
            if a != b:
                moved += 1
                wrong += b != "m4"
        self.assertAlmostEqual(cnt["m1"] / n, 1 / 6, delta=0.015)
        self.assertAlmostEqual(cnt["m3"] / n, 3 / 6, delta=0.015)
        self.assertEqual(wrong, 0)
        self.assertAlmostEqual(moved / n, 2 / 8, delta=0.015)


if __name__ == "__main__":
    unittest.main(verbosity=2)
