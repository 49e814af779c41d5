"""The bundled tasks: synthetic arithmetic (verifiable) and multistep problems (teaching)."""
