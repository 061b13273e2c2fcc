"""``python -m attnzoo.models``: print the variants table (markdown) used in the README.

The rows are the registry's: the 15 built-ins, then every variant an installed plugin package registered
(entry-point group ``attnzoo.variants``), each with its paper, equations and extra-math scopes.
"""

from .factory import count_params, create_model
from .registry import ALIASES, VARIANT_NAMES, VARIANTS


def variants_table(arch: str = "tiny") -> str:
    """Markdown table: variant, paper, equations, extra-math scopes, extra parameters, parameter count of a ViT of
    ``arch``."""
    base = count_params(create_model("standard", arch=arch))
    rows = ["| variant | paper | equations | extra-math scopes (ONNX `blocks.N.attn.<scope>/...`) | "
            "extra parameters per block | ViT-" + arch + " params (1000 classes) |",
            "|---|---|---|---|---|---|"]
    for name in VARIANT_NAMES:
        spec = VARIANTS[name]
        n = count_params(create_model(name, arch=arch))
        alias = [a for a, t in ALIASES.items() if t == name]
        label = f"`{name}`" + (f" (alias `{alias[0]}`)" if alias else "")
        if not spec.builtin:
            label += f" (plugin {spec.package}{' ' + spec.version if spec.version else ''})"
        scopes = ", ".join(f"`{s}`" for s in spec.extra_scopes) or "none"
        rows.append(f"| {label} | {spec.paper} | {spec.equations or '-'} | {scopes} | {spec.extra_params or '-'} | "
                    f"{n / 1e6:.2f} M ({(n - base) / base:+.1%}) |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(variants_table())
