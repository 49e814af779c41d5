"""import-linter contract types of this project's own (pyproject.toml, [tool.importlinter] contract_types)."""

from __future__ import annotations

import sys

from importlinter import Contract, ContractCheck, fields, output


class StdlibOnlyContract(Contract):
    """The packages in ``packages`` import nothing but themselves and the standard library (atlas_contract: both
    halves import it, the operator image without the training library). import-linter's own types cannot say
    "nothing else": a forbidden contract lists what it forbids, and the standard library is external to it too.
    Needs ``include_external_packages = true``."""

    type_name = "stdlib_only"

    packages = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        offenders = []
        for package in self.packages:  # type: ignore[attr-defined]
            for importer in sorted(graph.find_descendants(package) | {package}):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    own = imported == package or imported.startswith(f"{package}.")
                    if own or imported.split(".")[0] in sys.stdlib_module_names:
                        continue
                    lines = [d["line_number"] for d in graph.get_import_details(importer=importer, imported=imported)]
                    offenders.append((importer, imported, lines))
        return ContractCheck(kept=not offenders, metadata={"offenders": offenders})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for importer, imported, lines in check.metadata["offenders"]:
            where = ", ".join(f"l.{n}" for n in lines)
            output.print_error(f"{importer} imports {imported} ({where}): neither its own package nor the stdlib")
            output.new_line()
