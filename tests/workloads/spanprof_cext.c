/* spanprof_cext: a CPython extension module whose C functions do the work,
 * for the .eh_frame unwinding tests of mixed Python and native stacks.
 *
 *   spanprof_cext.crunch(n) -> crunch_outer -> crunch_inner
 *   spanprof_cext.mix(n) -> mix_outer -> mix_rounds (inlined) -> mix_step (inlined)
 *
 * crunch_inner spins through n rounds of a dependent multiply-add chain;
 * mix_outer does the same through two always-inlined functions, for the tests
 * of inlined frames and C source lines (its DWARF says where each was
 * inlined: the lines marked INLINED-CALL below).
 * Built against Debian's /usr/bin/python3.11 (python3.11-dev) without frame
 * pointers (-fomit-frame-pointer, like the interpreter itself) into
 * target/workloads/cext/spanprof_cext$(EXT_SUFFIX); tests/workloads/py_cext.py
 * calls it. Each call uses its callee's result afterwards, so no call is a
 * tail call and every function keeps its frame. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define ROUND_ITERATIONS 1000u

static volatile uint64_t sink;

__attribute__((noinline, noclone)) static uint64_t crunch_inner(uint64_t acc, long rounds)
{
	/* NB: the empty asm with the accumulator as an in/out operand keeps -O2
	 * from folding the loop; every iteration really runs. */
	for (long r = 0; r < rounds; r++) {
		for (uint32_t i = 0; i < ROUND_ITERATIONS; i++) {
			acc = acc * 6364136223846793005ull + 1442695040888963407ull;
			__asm__ volatile("" : "+r"(acc) : : "memory");
		}
	}
	return acc;
}

__attribute__((noinline, noclone)) static uint64_t crunch_outer(long rounds)
{
	uint64_t acc = crunch_inner(sink, rounds);
	sink = acc;
	return acc >> 1;
}

__attribute__((always_inline)) static inline uint64_t mix_step(uint64_t acc)
{
	acc = acc * 2862933555777941757ull + 3037000493ull; /* MIX-STEP */
	__asm__ volatile("" : "+r"(acc) : : "memory"); /* MIX-STEP */
	return acc;
}

__attribute__((always_inline)) static inline uint64_t mix_rounds(uint64_t acc, long rounds)
{
	for (long r = 0; r < rounds; r++) {
		for (uint32_t i = 0; i < ROUND_ITERATIONS; i++)
			acc = mix_step(acc); /* INLINED-CALL mix_step */
	}
	return acc;
}

__attribute__((noinline, noclone)) static uint64_t mix_outer(long rounds)
{
	uint64_t acc = mix_rounds(sink, rounds); /* INLINED-CALL mix_rounds */
	sink = acc;
	return acc >> 1;
}

static long rounds_of(PyObject *arg)
{
	long rounds = PyLong_AsLong(arg);
	if (rounds == -1 && PyErr_Occurred())
		return -1;
	if (rounds < 0) {
		PyErr_SetString(PyExc_ValueError, "n must be >= 0");
		return -1;
	}
	return rounds;
}

static PyObject *mix(PyObject *self, PyObject *arg)
{
	(void)self;
	long rounds = rounds_of(arg);
	if (rounds < 0)
		return NULL;
	return PyLong_FromUnsignedLongLong(mix_outer(rounds));
}

static PyObject *crunch(PyObject *self, PyObject *arg)
{
	(void)self;
	long rounds = PyLong_AsLong(arg);
	if (rounds == -1 && PyErr_Occurred())
		return NULL;
	if (rounds < 0) {
		PyErr_SetString(PyExc_ValueError, "crunch: n must be >= 0");
		return NULL;
	}
	uint64_t acc = crunch_outer(rounds);
	return PyLong_FromUnsignedLongLong(acc);
}

static PyMethodDef methods[] = {
	{"crunch", crunch, METH_O, "crunch(n): n rounds of busy work in C; returns a number."},
	{"mix", mix, METH_O, "mix(n): crunch's work through inlined functions."},
	{NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
	PyModuleDef_HEAD_INIT,
	.m_name = "spanprof_cext",
	.m_doc = "Busy work in C for spanprof's unwinding tests.",
	.m_size = -1,
	.m_methods = methods,
};

PyMODINIT_FUNC PyInit_spanprof_cext(void);

PyMODINIT_FUNC PyInit_spanprof_cext(void)
{
	return PyModule_Create(&module);
}
