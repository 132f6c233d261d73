"""Tensors between NumPy and loom without copies, and the operator API:
from_numpy wraps the array's memory (same address, strided views too) and keeps the
array alive exactly until the last loom tensor over it goes (derived views included);
np.asarray of a loom tensor shares its memory both ways; operators read strided NumPy
memory and write into NumPy out= buffers (poisoned first) with NumPy's results; views
(transpose, slice, select, reshape) are zero-copy; what loom cannot describe (negative
strides, float64, a GPU tensor to NumPy) raises instead of copying; loom errors raise
loom.Error subclasses carrying loom's message.
"""
import gc
import os
import unittest
import weakref

import numpy as np

import loom


def addr(a):
    return a.__array_interface__["data"][0]


class TestNumpyZeroCopy(unittest.TestCase):
    def test_from_numpy_shares_memory_and_keeps_the_array_alive(self):
        base = loom.live_owners()
        a = np.arange(24, dtype=np.float32).reshape(4, 6)
        ref = weakref.ref(a)
        t = loom.from_numpy(a)
        self.assertEqual(t.data_ptr, addr(a))
        self.assertEqual((t.shape, t.strides, t.dtype, t.device), ((4, 6), (6, 1), "f32", "cpu"))
        tt = t.transpose(0, 1)
        sl = t[1:4:2, 2]
        self.assertEqual(sl.shape, (2,))
        self.assertEqual(sl.tolist(), [8.0, 20.0])
        del a, t
        gc.collect()
        self.assertIsNotNone(ref(), "the array died while loom views of it live")
        self.assertEqual(loom.live_owners(), base + 1)
        del tt
        gc.collect()
        self.assertIsNotNone(ref())
        del sl
        gc.collect()
        self.assertIsNone(ref(), "the array outlived the last loom tensor over it")
        self.assertEqual(loom.live_owners(), base)

    def test_strided_numpy_views_are_wrapped_not_copied(self):
        a = np.random.default_rng(1).standard_normal((8, 10)).astype(np.float32)
        for v in (a.T, a[1:7:2, ::3], a[:, 4], a[2]):
            t = loom.from_numpy(v)
            self.assertEqual(t.data_ptr, addr(v))
            self.assertEqual(t.strides, tuple(s // 4 for s in v.strides))
            back = t.numpy()
            self.assertEqual(addr(back), addr(v))
            np.testing.assert_array_equal(back, v)

    def test_numpy_of_a_loom_tensor_shares_memory_both_ways(self):
        t = loom.zeros((3, 5), "f32")
        a = np.asarray(t)
        self.assertEqual(addr(a), t.data_ptr)
        self.assertIs(a.base, t)
        a[1, 2] = 7.0
        self.assertEqual(t.tolist()[1][2], 7.0)
        loom.ops.scale(t, 2.0, out=t)
        self.assertEqual(a[1, 2], 14.0)
        del t
        gc.collect()
        self.assertEqual(a[1, 2], 14.0)  # the array keeps the loom tensor alive
        for dt, npdt in (("f16", np.float16), ("i32", np.int32), ("i64", np.int64), ("u8", np.uint8)):
            self.assertEqual(loom.zeros((2,), dt).numpy().dtype, npdt)

    def test_what_loom_cannot_describe_raises(self):
        a = np.arange(6, dtype=np.float32)
        with self.assertRaises(ValueError):
            loom.from_numpy(a[::-1])
        with self.assertRaises(TypeError):
            loom.from_numpy(np.zeros(3))  # float64
        with self.assertRaises(TypeError):
            loom.zeros((2,), "bf16").numpy()
        t = loom.tensor([1.5, 2.5])  # an explicit copy, float64 -> f32
        self.assertEqual((t.dtype, t.tolist()), ("f32", [1.5, 2.5]))

    def test_empty_and_scalar(self):
        e = loom.from_numpy(np.zeros((0, 3), np.float32))
        self.assertEqual((e.shape, e.numel), ((0, 3), 0))
        self.assertEqual(e.numpy().shape, (0, 3))
        s = loom.from_numpy(np.array(3, dtype=np.int64))
        self.assertEqual((s.shape, s.tolist()), ((), 3))


class TestOps(unittest.TestCase):
    def setUp(self):
        self.rng = np.random.default_rng(7)

    def randn(self, *shape):
        return self.rng.standard_normal(shape).astype(np.float32)

    def poisoned(self, *shape):
        return np.full(shape, np.nan, np.float32)

    def test_matmul_reads_strided_numpy_and_writes_into_numpy(self):
        a, w = self.randn(5, 7), self.randn(6, 7)
        out = self.poisoned(5, 6)
        r = loom.ops.matmul(a, w.T, out=out)  # w.T: a transposed view, no copy
        self.assertIs(r, out)
        np.testing.assert_allclose(out, a @ w.T, rtol=1e-5, atol=1e-5)
        big = self.poisoned(5, 9)  # a padded caller buffer: write columns 1..6 only
        loom.ops.matmul(a, w.T, out=big[:, 1:7])
        np.testing.assert_allclose(big[:, 1:7], a @ w.T, rtol=1e-5, atol=1e-5)
        self.assertTrue(np.isnan(big[:, 0]).all() and np.isnan(big[:, 7:]).all())
        t = loom.ops.matmul(loom.from_numpy(a), loom.from_numpy(w).T)
        np.testing.assert_allclose(t.numpy(), a @ w.T, rtol=1e-5, atol=1e-5)

    def test_elementwise_norm_softmax_reductions(self):
        x, y, g = self.randn(4, 8), self.randn(8), self.randn(8)
        np.testing.assert_allclose(loom.ops.add(x, y).numpy(), x + y, rtol=1e-6)  # broadcast
        np.testing.assert_allclose(loom.ops.mul(x, y).numpy(), x * y, rtol=1e-6)
        np.testing.assert_allclose(loom.ops.silu(x).numpy(), x / (1 + np.exp(-x)), rtol=1e-5, atol=1e-6)
        ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
        want = x / np.sqrt(ms + 1e-5) * g
        out = self.poisoned(4, 8)
        loom.ops.rmsnorm(x, g, eps=1e-5, out=out)
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        e = np.exp(0.5 * x - np.max(0.5 * x, axis=-1, keepdims=True))
        np.testing.assert_allclose(loom.ops.softmax(x, scale=0.5).numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5,
                                   atol=1e-7)
        np.testing.assert_array_equal(loom.ops.argmax(x).numpy(), np.argmax(x, axis=-1))
        np.testing.assert_allclose(loom.ops.sum(x, 0).numpy(), x.sum(0), rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(loom.ops.max(x, 1).numpy(), x.max(1))
        h = loom.ops.cast(x, "bf16")
        back = loom.ops.cast(h, "f32").numpy()
        np.testing.assert_allclose(back, x, rtol=1e-2, atol=1e-2)
        table, ids = self.randn(10, 4), np.array([3, 0, 9], np.int32)
        np.testing.assert_array_equal(loom.ops.embedding(table, ids).numpy(), table[ids])

    def test_errors_carry_loom_messages(self):
        with self.assertRaises(loom.ShapeMismatchError) as cm:
            loom.ops.matmul(self.randn(2, 3), self.randn(4, 5))
        self.assertIsInstance(cm.exception, loom.Error)
        self.assertEqual(cm.exception.status_name, "LM_SHAPE_MISMATCH")
        self.assertTrue(cm.exception.detail, "no message from lm_last_error")
        self.assertIn(cm.exception.detail, str(cm.exception))
        with self.assertRaises(loom.Error) as cm:
            loom.Model(os.path.join(os.environ.get("LOOM_SOURCE_DIR", "."), "no-such-model"))
        self.assertIn("no-such-model", str(cm.exception))
        with self.assertRaises(loom.InvalidArgumentError):
            loom.empty((2, -1))
        with self.assertRaises(loom.Error):
            loom.device("tpu")
        with self.assertRaises(loom.Error):
            loom.wrap(0, (4,), "f32")  # NULL data with elements


if __name__ == "__main__":
    unittest.main()
