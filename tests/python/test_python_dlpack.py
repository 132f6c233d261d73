"""PyTorch <-> loom through DLPack without copies, checked by pointer equality:
torch.from_dlpack(loom tensor) and loom.from_dlpack(torch tensor) share memory (writes
on either side are seen by the other; strided and transposed tensors keep their
strides; f32/bf16/f16/i32/i64/u8); the producer's deleter runs exactly once, when the
last consumer-side tensor goes (loom.live_owners() returns to its start); loom
operators run on torch memory and write into torch out= tensors. Runs on the CPU with
any torch (Debian's python3-torch) and, when torch sees a GPU and loom was built with
CUDA, on cuda:0 as well. Skipped without torch.
"""
import gc
import sys
import unittest

import numpy as np

import loom

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None


def devices():
    out = ["cpu"]
    if torch is not None and torch.cuda.is_available() and loom.cuda_device_count() > 0:
        out.append("cuda:0")
    return out


def setUpModule():
    if torch is not None:  # the log says which devices the round trips covered
        print("DLPack devices: " + ", ".join(devices()), file=sys.stderr)


@unittest.skipIf(torch is None, "PyTorch is not installed (Debian: apt-get install python3-torch)")
class TestDLPack(unittest.TestCase):
    def sync(self, dev):
        if dev != "cpu":
            torch.cuda.synchronize()

    def test_torch_to_loom_shares_memory(self):
        for dev in devices():
            with self.subTest(device=dev):
                base = loom.live_owners()
                x = torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4)
                t = loom.from_dlpack(x)
                self.assertEqual(t.data_ptr, x.data_ptr())
                self.assertEqual((t.shape, t.strides, t.device), ((3, 4), (4, 1), dev))
                xt = x.t()
                tt = loom.from_dlpack(xt)
                self.assertEqual((tt.data_ptr, tt.strides), (xt.data_ptr(), (1, 4)))
                loom.ops.scale(t, 2.0, out=t)  # loom writes torch's memory
                if dev != "cpu":
                    loom.context(dev).synchronize()
                self.assertEqual(x[2, 3].item(), 22.0)
                self.assertEqual(loom.live_owners(), base + 2)
                del t, tt
                gc.collect()
                self.assertEqual(loom.live_owners(), base, "the DLPack deleter did not run")

    def test_loom_to_torch_shares_memory(self):
        for dev in devices():
            with self.subTest(device=dev):
                base = loom.live_owners()
                t = loom.zeros((4, 6), "f32", dev)
                x = torch.from_dlpack(t)
                self.assertEqual(x.data_ptr(), t.data_ptr)
                self.assertEqual((tuple(x.shape), x.stride(), str(x.device)), ((4, 6), (6, 1), dev))
                x[1, 2] = 5.0
                self.sync(dev)
                self.assertEqual(t.to("cpu").tolist()[1][2], 5.0)
                tv = t.transpose(0, 1)[1:5:2]  # a strided loom view: [2, 4], strides (2, 6)
                xv = torch.from_dlpack(tv)
                self.assertEqual((xv.data_ptr(), xv.stride(), tuple(xv.shape)), (tv.data_ptr, (2, 6), (2, 4)))
                del t, tv
                gc.collect()
                self.assertEqual(x[1, 2].item(), 5.0)  # torch keeps loom's memory alive
                self.assertEqual(loom.live_owners(), base + 2)
                del x, xv
                gc.collect()
                self.assertEqual(loom.live_owners(), base, "torch never called loom's deleter")

    def test_round_trip_and_dtypes(self):
        dts = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "i32": torch.int32,
               "i64": torch.int64, "u8": torch.uint8}
        for dev in devices():
            for name, tdt in dts.items():
                with self.subTest(device=dev, dtype=name):
                    x = torch.ones((2, 3), dtype=tdt, device=dev)
                    t = loom.from_dlpack(x)
                    self.assertEqual((t.dtype, t.data_ptr), (name, x.data_ptr()))
                    y = torch.from_dlpack(t)  # torch -> loom -> torch: still one buffer
                    self.assertEqual((y.data_ptr(), y.dtype), (x.data_ptr(), tdt))

    def test_ops_on_torch_memory(self):
        for dev in devices():
            with self.subTest(device=dev):
                g = torch.Generator().manual_seed(0)
                a = torch.randn(5, 7, generator=g).to(dev)
                w = torch.randn(6, 7, generator=g).to(dev)
                out = torch.full((5, 6), float("nan"), device=dev)
                loom.ops.matmul(a, w.t(), out=out)
                if dev != "cpu":
                    loom.context(dev).synchronize()
                np.testing.assert_allclose(out.cpu().numpy(), (a @ w.t()).cpu().numpy(), rtol=1e-4, atol=1e-4)
                r = loom.ops.rmsnorm(a, torch.ones(7, device=dev), eps=1e-6)
                rt = torch.from_dlpack(r)
                want = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6)
                np.testing.assert_allclose(rt.cpu().numpy(), want.cpu().numpy(), rtol=1e-4, atol=1e-5)

    def test_a_used_capsule_is_refused(self):
        x = torch.zeros(3)
        cap = x.__dlpack__()
        t = loom.from_dlpack(cap)
        with self.assertRaises(ValueError):
            loom.from_dlpack(cap)
        del t


if __name__ == "__main__":
    unittest.main()
