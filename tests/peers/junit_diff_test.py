#!/usr/bin/env python3
"""ctest peers.junit_diff: junit_diff.load reads what pytest wrote.

The file below is the shape pytest 9.1 with pytest-xdist wrote on the H200
for CuPy's suite cut short by SIGINT (2026-11-29): a test in flight when the
run stopped leaves a <testcase> with neither classname nor name. It did not
pass: it never finished, so it is no test id at all.
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import junit_diff  # noqa: E402

INTERRUPTED = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests">\
<testsuite name="pytest" errors="0" failures="1" skipped="1" tests="3" time="401.863">\
<testcase classname="tests.cupy_tests.cuda_tests.test_stream.TestStream" name="test_stream_thread" time="0.089" />\
<testcase classname="tests.cupy_tests.cuda_tests.test_device.TestDeviceSwitch" name="test_context" time="0.001">\
<failure message="cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorInvalidDevice: invalid device ordinal">\
trace</failure></testcase>\
<testcase time="0.000" />\
<testcase classname="tests.cupy_tests.core_tests.test_ndarray_copy_and_view.TestArrayCopy" name="test_special" time="0.000">\
<skipped type="pytest.skip" message="Special copy disabled">skip</skipped></testcase>\
</testsuite></testsuites>
"""


class Load(unittest.TestCase):
    def test_a_test_cut_short_is_not_counted(self):
        with tempfile.NamedTemporaryFile("w", suffix=".xml", delete=False) as f:
            f.write(INTERRUPTED)
        try:
            results = junit_diff.load(f.name)
        finally:
            os.unlink(f.name)
        self.assertEqual(sorted(results), [
            "tests.cupy_tests.core_tests.test_ndarray_copy_and_view.TestArrayCopy::test_special",
            "tests.cupy_tests.cuda_tests.test_device.TestDeviceSwitch::test_context",
            "tests.cupy_tests.cuda_tests.test_stream.TestStream::test_stream_thread",
        ])
        self.assertEqual(junit_diff.counts(results),
                         "3 tests: 1 passed, 1 failed, 0 error, 1 skipped, 0 xfailed")
        self.assertEqual(results["tests.cupy_tests.cuda_tests.test_device.TestDeviceSwitch::test_context"],
                         ("failed", "cupy_backends.cuda.api.runtime.CUDARuntimeError: "
                          "cudaErrorInvalidDevice: invalid device ordinal"))


if __name__ == "__main__":
    unittest.main()
